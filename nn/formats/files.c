/* files.c: the file-system side of checkpoints: where a save writes (symbolic
 * links followed), its temporary files (unnamed where the file system allows,
 * else short names created exclusively; with the permission bits of the file
 * they replace; removed when a killed save left them), syncing a directory,
 * and opening a file for reading only when it is a regular one. */
#define _GNU_SOURCE /* O_TMPFILE, flock */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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

static bool pid_gone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

/* Whether the temporary name in dir d (of process pid) is a killed save's.
 * A save holds an exclusive flock on its temporary from its first byte
 * until the rename has taken the name away, and the kernel drops the lock
 * when the process dies. So a file whose lock is free is left over if it has
 * bytes, or if its process is gone (an empty one may be a live save between
 * its open and its flock). Where flock does not work, the process alone
 * decides. A file we cannot open (another user's, unreadable) is kept.
 * 1 (removable, its lock held in *fd), 0 (kept). */
static int temp_stale(int d, const char *name, pid_t pid, int *fd, struct stat *st) {
    *fd = openat(d, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (*fd < 0) return 0;
    bool stale = false;
    if (fstat(*fd, st) == 0 && S_ISREG(st->st_mode)) {
        if (flock(*fd, LOCK_EX | LOCK_NB) == 0) stale = st->st_size > 0 || pid_gone(pid);
        else stale = errno != EWOULDBLOCK && pid_gone(pid); /* no locks here */
    }
    if (!stale) close(*fd), *fd = -1;
    return stale;
}

/* Removes the temporaries that saves killed before their rename left in dir
 * (see temp_stale; our own process's are never touched). Best effort: a
 * directory that cannot be listed or written is left as it is. */
void nn_remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    pid_t self = getpid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        pid_t pid = temp_pid(e->d_name);
        if (pid <= 0 || pid == self) continue;
        int fd;
        struct stat st, now;
        if (!temp_stale(dirfd(d), e->d_name, pid, &fd, &st)) continue;
        /* still the file we locked (not one made under the name since) */
        if (fstatat(dirfd(d), e->d_name, &now, AT_SYMLINK_NOFOLLOW) == 0 &&
            now.st_ino == st.st_ino && now.st_dev == st.st_dev)
            unlinkat(dirfd(d), e->d_name, 0);
        close(fd);
    }
    closedir(d);
}

void nn_remove_stale_temps_beside(const char *path) {
    nn_target t = {0};
    if (path && nn_resolve(path, &t) == 0) nn_remove_stale_temps(t.dir);
    nn_target_free(&t);
}

static _Atomic int named_only; /* nn_temp_force_named: tests of the fallback */

int nn_temp_force_named(int on) { return atomic_exchange(&named_only, on != 0); }

/* dir/.nabla-tmp-<pid>-<n>, a short name (a target's name may be up to
 * NAME_MAX itself) that nn_remove_stale_temps knows, into buf. */
static void temp_name(const nn_target *t, char *buf, size_t cap) {
    static _Atomic unsigned counter;
    snprintf(buf, cap, "%s/" TEMP_PREFIX "%ld-%u", t->dir, (long)getpid(), counter++);
}

/* Where the file system has them (Linux's O_TMPFILE, and /proc to link one
 * by), the temporary is a file without a name: a process killed while
 * writing it leaves nothing behind. Otherwise, a file named as temp_name
 * says, created exclusively. Either way with the old file's permission bits
 * when there is one (the umask can only narrow them), so it is never
 * readable by more users than the file it replaces; otherwise 0666 & ~umask,
 * as fopen; and flock'ed (see temp_stale). */
int nn_temp_open(const nn_target *t, nn_temp *tmp) {
    size_t len = strlen(t->dir) + sizeof TEMP_PREFIX + 48;
    *tmp = (nn_temp){.fd = -1};
    mode_t mode = t->exists ? t->mode & 0777 : 0666;
#ifdef O_TMPFILE
    if (!atomic_load(&named_only)) {
        int fd = open(t->dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, mode);
        char proc[64];
        struct stat st;
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
        if (fd >= 0 && stat(proc, &st) == 0) {
            flock(fd, LOCK_EX | LOCK_NB); /* nobody else can open it */
            tmp->fd = fd;
            tmp->unnamed = true;
            return 0;
        }
        if (fd >= 0) close(fd); /* no /proc to give it a name by */
    }
#endif
    char *name = malloc(len);
    if (!name) return errno = ENOMEM, -1;
    for (int attempt = 0; attempt < 100; attempt++) {
        temp_name(t, name, len);
        int fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
        if (fd >= 0) {
            /* waits while a cleaner looks at it (it lets go at once) */
            while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {}
            tmp->fd = fd;
            tmp->name = name;
            return 0;
        }
        if (errno != EEXIST) break;
    }
    int e = errno;
    free(name);
    errno = e;
    return -1;
}

/* An unnamed temporary linked into t's directory under a temporary's name. */
static int temp_link(const nn_target *t, nn_temp *tmp) {
    size_t len = strlen(t->dir) + sizeof TEMP_PREFIX + 48;
    char proc[64], *name = malloc(len);
    if (!name) return errno = ENOMEM, -1;
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", tmp->fd);
    for (int attempt = 0; attempt < 100; attempt++) {
        temp_name(t, name, len);
        if (linkat(AT_FDCWD, proc, AT_FDCWD, name, AT_SYMLINK_FOLLOW) == 0) {
            tmp->name = name;
            return 0;
        }
        if (errno != EEXIST) break;
    }
    int e = errno;
    free(name);
    errno = e;
    return -1;
}

/* With ok (its contents written and synced), gives the temporary its name
 * and renames it over t->path; otherwise (or when that fails) removes it.
 * The descriptor is closed either way (its lock last, once the name has
 * gone). 0, or -1 with errno. */
int nn_temp_finish(nn_temp *tmp, const nn_target *t, bool ok) {
    int rc = ok ? 0 : -1, e = errno;
    if (rc == 0 && tmp->unnamed && temp_link(t, tmp) != 0) rc = -1, e = errno;
    int hold = rc == 0 ? dup(tmp->fd) : -1; /* the lock, past close's check */
    if (close(tmp->fd) != 0 && rc == 0) rc = -1, e = errno;
    if (rc == 0 && rename(tmp->name, t->path) != 0) rc = -1, e = errno;
    if (rc != 0 && tmp->name) unlink(tmp->name);
    if (hold >= 0) close(hold);
    free(tmp->name);
    *tmp = (nn_temp){.fd = -1};
    errno = e;
    return rc;
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
