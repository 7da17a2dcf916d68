/* files.c: the file-system side of checkpoints: where a save writes (symbolic
 * links followed), its temporary files (short names, created exclusively
 * with the permission bits of the file they replace, removed when a killed
 * save left them), syncing a directory, and opening a file for reading
 * only when it is a regular one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "files_internal.h"
#include "../nn_internal.h"

void nn_target_free(nn_target *t) {
    free(t->path);
    free(t->dir);
}

/* The directory part of path: "." without a slash, "/" for "/name". */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    size_t n = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, slash ? path : ".", n);
        d[n] = 0;
    }
    return d;
}

/* What the symbolic link at path points to, as a path from here: a relative
 * target is relative to the link's directory. NULL with errno set. */
static char *link_target(const char *path) {
    for (size_t cap = 256;; cap *= 2) {
        char *buf = malloc(cap);
        ssize_t n = buf ? readlink(path, buf, cap) : -1;
        if (n < 0) {
            free(buf);
            return NULL;
        }
        if ((size_t)n == cap) { /* maybe cut: try a larger buffer */
            free(buf);
            continue;
        }
        buf[n] = 0;
        const char *slash = strrchr(path, '/');
        if (buf[0] == '/' || !slash) return buf;
        size_t d = (size_t)(slash - path) + 1;
        char *joined = malloc(d + (size_t)n + 1);
        if (joined) {
            memcpy(joined, path, d);
            memcpy(joined + d, buf, (size_t)n + 1);
        }
        free(buf);
        if (!joined) errno = ENOMEM;
        return joined;
    }
}

/* Follows path's symbolic links (realpath would refuse a link whose file
 * does not exist yet, which a save creates). 0, or an errno value. */
int nn_resolve(const char *path, nn_target *t) {
    char *cur = strdup(path);
    for (int hops = 0; cur; hops++) {
        struct stat st;
        bool there = lstat(cur, &st) == 0;
        if (!there || !S_ISLNK(st.st_mode)) {
            t->path = cur;
            t->exists = there && S_ISREG(st.st_mode);
            t->mode = t->exists ? st.st_mode : 0;
            t->dir = dir_of(cur);
            return t->dir ? 0 : ENOMEM;
        }
        if (hops == 40) { /* Linux's own limit on links followed */
            free(cur);
            return ELOOP;
        }
        char *next = link_target(cur);
        int e = errno;
        free(cur);
        if (!next) return e;
        cur = next;
    }
    return ENOMEM;
}

#define TEMP_PREFIX ".nabla-tmp-"

/* The pid in a temporary's name, ".nabla-tmp-<pid>-<n>" exactly (decimal,
 * no sign or leading zero), or 0 for any other name. */
static pid_t temp_pid(const char *name) {
    size_t k = sizeof TEMP_PREFIX - 1;
    if (strncmp(name, TEMP_PREFIX, k)) return 0;
    const char *p = name + k;
    long long pid = 0;
    if (*p < '1' || *p > '9') return 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((pid = pid * 10 + (*p - '0')) > INT32_MAX) return 0;
    if (*p++ != '-' || *p < '0' || *p > '9' || (*p == '0' && p[1])) return 0;
    while (*p >= '0' && *p <= '9') p++;
    return *p ? 0 : (pid_t)pid;
}

/* Removes the temporaries that saves killed before their rename left in dir:
 * regular files whose process is gone (kill(pid, 0) fails with ESRCH; a live
 * process, ours or another user's, keeps its own). Best effort: a directory
 * that cannot be listed is left as it is. */
void nn_remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    pid_t self = getpid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        pid_t pid = temp_pid(e->d_name);
        struct stat st;
        if (pid <= 0 || pid == self || kill(pid, 0) == 0 || errno != ESRCH) continue;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

/* A fresh file dir/.nabla-tmp-<pid>-<n>, created exclusively: a short name
 * (a target's name may be up to NAME_MAX itself) that remove_stale_temps
 * knows. It is made with the old file's bits when there is one (the umask
 * can only narrow them), so it is never readable by more users than the file
 * it replaces; otherwise 0666 & ~umask, as fopen. */
int nn_open_temp(const nn_target *t, char **tmp_out) {
    size_t len = strlen(t->dir) + sizeof TEMP_PREFIX + 48;
    char *tmp = malloc(len);
    if (!tmp) return -1;
    static _Atomic unsigned counter;
    mode_t mode = t->exists ? t->mode & 0777 : 0666;
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(tmp, len, "%s/" TEMP_PREFIX "%ld-%u", t->dir, (long)getpid(), counter++);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd >= 0) {
            *tmp_out = tmp;
            return fd;
        }
        if (errno != EEXIST) break;
    }
    free(tmp);
    return -1;
}

/* The directory entry made by rename survives a crash only once the
 * directory itself is synced; a failure here is not worth failing the save. */
void nn_sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

/* Opens path for reading if it is a regular file. O_NONBLOCK because open()
 * of a FIFO waits for a writer (forever) before fstat could refuse it; it is
 * cleared again for the reads. -1 with the reason in msg. */
int nn_open_regular(const char *path, struct stat *st, char *msg, size_t cap) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 || fstat(fd, st) != 0) {
        snprintf(msg, cap, "cannot open \"%s\": %s", path, strerror(errno));
    } else if (!S_ISREG(st->st_mode)) {
        snprintf(msg, cap, "\"%s\" is not a regular file", path);
    } else {
        int flags = fcntl(fd, F_GETFL);
        if (flags != -1 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != -1) return fd;
        snprintf(msg, cap, "cannot open \"%s\": %s", path, strerror(errno));
    }
    if (fd >= 0) close(fd);
    return -1;
}


int nn_read_all(int fd, const char *fn, const char *path, unsigned char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            nn_error("%s: cannot read \"%s\": %s", fn, path,
                     r < 0 ? strerror(errno) : "the file shrank while being read");
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}
