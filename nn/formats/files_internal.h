/* files_internal.h: the file-system helpers of checkpoints (nn/formats/files.c). */
#ifndef NABLA_NN_FILES_INTERNAL_H
#define NABLA_NN_FILES_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Where a save writes: the file path names once symbolic links are followed
 * (a link is kept and the file it points to replaced, as fopen would write
 * through it), and that file's directory, where the temporary goes. */
typedef struct {
    char *path, *dir;
    bool exists; /* a regular file is there: the new one gets its permission bits */
    mode_t mode;
} nn_target;

/* Follows path's symbolic links into t (nn_target_free it): 0, or an errno value. */
int nn_resolve(const char *path, nn_target *t);
void nn_target_free(nn_target *t);
/* Removes the temporaries killed saves left in dir (their process is gone). */
void nn_remove_stale_temps(const char *dir);
/* A fresh temporary file beside t: its descriptor (its name in *tmp_out, to
 * free), or -1 with errno. */
int nn_open_temp(const nn_target *t, char **tmp_out);
void nn_sync_dir(const char *dir);
/* path opened for reading if it is a regular file (never waits on a FIFO):
 * its descriptor and *st, or -1 with the reason in msg. */
int nn_open_regular(const char *path, struct stat *st, char *msg, size_t cap);
/* Reads exactly n bytes of fd (retrying short reads and EINTR): 0, or -1
 * with "fn: cannot read "path": reason" (a file that shrank included). */
int nn_read_all(int fd, const char *fn, const char *path, unsigned char *buf, size_t n);

#endif
