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
/* Removes the temporaries killed saves left in dir (named ones whose lock
 * is free and whose process is gone, or which have bytes: files.c). */
void nn_remove_stale_temps(const char *dir);
/* The same in the directory a save to path would write its temporary in. */
void nn_remove_stale_temps_beside(const char *path);
/* A save's temporary file beside its target. */
typedef struct {
    int fd;
    char *name;   /* its path, once it has one */
    bool unnamed; /* O_TMPFILE: it gets a name only in nn_temp_finish */
} nn_temp;
/* A fresh temporary for t: 0, or -1 with errno. */
int nn_temp_open(const nn_target *t, nn_temp *tmp);
/* With ok (written and fsync'ed), renames the temporary over t->path; else,
 * or when that fails, removes it. Closes it either way: 0, or -1 errno. */
int nn_temp_finish(nn_temp *tmp, const nn_target *t, bool ok);
/* Tests: on != 0 makes temporaries named files from the start (as where
 * O_TMPFILE is missing); returns the previous setting. */
int nn_temp_force_named(int on);
void nn_sync_dir(const char *dir);
/* path opened for reading if it is a regular file (never waits on a FIFO):
 * its descriptor and *st, or -1 with the reason in msg. */
int nn_open_regular(const char *path, struct stat *st, char *msg, size_t cap);
/* Reads exactly n bytes of fd (retrying short reads and EINTR): 0, or -1
 * with "fn: cannot read "path": reason" (a file that shrank included). */
int nn_read_all(int fd, const char *fn, const char *path, unsigned char *buf, size_t n);

#endif
