/* em_check_output_dir: can a run write its files into a folder? Checked
 * before training so that a bad --out fails at once, not after epoch 1. */
#include "ember/train.h"
#include "runtime/runtime_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Creates and removes a file in @p dir: 0, or the errno of the failure. */
static int probe(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/.ember-write-probe-XXXXXX", dir);
    int fd = mkstemp(path);
    if (fd < 0) return errno ? errno : EIO;
    close(fd);
    return unlink(path) == 0 ? 0 : (errno ? errno : EIO);
}

em_status em_check_output_dir(const char *dir)
{
    if (!dir || !*dir) return em__set_error(EM_ERR_INVALID, "em_check_output_dir: the output directory is %s", dir ? "empty" : "NULL");
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return em__set_error(EM_ERR_INVALID, "output directory path is too long (%zu bytes)", strlen(dir));
    /* drop trailing slashes ("out/" is "out") */
    for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--) path[n - 1] = 0;
    struct stat sb;
    if (stat(path, &sb) == 0) {
        if (!S_ISDIR(sb.st_mode)) return em__set_error(EM_ERR_IO, "output directory %s exists and is not a directory", dir);
        int e = probe(path);
        if (e) return em__set_error(EM_ERR_IO, "output directory %s is not writable (cannot create a file in it: %s)", dir, strerror(e));
        return EM_OK;
    }
    if (errno != ENOENT && errno != ENOTDIR) return em__set_error(EM_ERR_IO, "output directory %s: %s", dir, strerror(errno));
    /* it does not exist: the nearest existing ancestor must be a directory we can create it in */
    char anc[4096];
    snprintf(anc, sizeof anc, "%s", path);
    for (;;) {
        char *slash = strrchr(anc, '/');
        if (!slash) {
            snprintf(anc, sizeof anc, ".");
        } else if (slash == anc) {
            anc[1] = 0; /* "/" */
        } else {
            *slash = 0;
            if (stat(anc, &sb) != 0 && (errno == ENOENT || errno == ENOTDIR)) continue;
        }
        break;
    }
    if (stat(anc, &sb) != 0)
        return em__set_error(EM_ERR_IO, "cannot create output directory %s: %s: %s", dir, anc, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return em__set_error(EM_ERR_IO, "cannot create output directory %s: %s is not a directory", dir, anc);
    int e = probe(anc);
    if (e) return em__set_error(EM_ERR_IO, "cannot create output directory %s: cannot write in %s: %s", dir, anc, strerror(e));
    return EM_OK;
}
