#include "outputs.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cli_outputs {
    int n;
    const char *opt[16], *path[16];
    char tmp[16][4200];
};
cli_outputs *cli_outputs_new(void) { return calloc(1, sizeof(cli_outputs)); }
int cli_outputs_add(cli_outputs *s, const char *option, const char *path, ag_err *err) {
    (void)err;
    s->opt[s->n] = option;
    s->path[s->n++] = path;
    return 0;
}
int cli_outputs_input(cli_outputs *s, const char *option, const char *path, ag_err *err) {
    (void)s, (void)option, (void)path, (void)err;
    return 0;
}
int cli_outputs_write(cli_outputs *s, const char *option, int (*fn)(FILE *, void *), void *arg, ag_err *err) {
    for (int i = 0; i < s->n; i++) {
        if (strcmp(s->opt[i], option)) continue;
        if (strcmp(s->path[i], "-") == 0) return fn(stdout, arg) == 0 && fflush(stdout) == 0 ? 0 : -1;
        snprintf(s->tmp[i], sizeof s->tmp[i], "%s.tmp", s->path[i]);
        FILE *f = fopen(s->tmp[i], "w");
        if (!f) { ag_err_set(err, "%s: cannot write", s->path[i]); return -1; }
        int rc = fn(f, arg);
        if (fclose(f) != 0) rc = -1;
        if (rc) ag_err_set(err, "%s: write failed", s->path[i]);
        return rc;
    }
    return 0;
}
int cli_outputs_commit(cli_outputs *s, ag_err *err) {
    for (int i = 0; i < s->n; i++)
        if (s->tmp[i][0] && rename(s->tmp[i], s->path[i]) != 0) { ag_err_set(err, "%s: cannot rename", s->path[i]); return -1; }
    for (int i = 0; i < s->n; i++) s->tmp[i][0] = 0;
    return 0;
}
void cli_outputs_free(cli_outputs *s) {
    for (int i = 0; s && i < s->n; i++) if (s->tmp[i][0]) unlink(s->tmp[i]);
    free(s);
}

#include "model.h"
int llama_model_save_file(const llama_model *m, FILE *f, bool grads, ag_err *err) {
    char tmp[] = "/tmp/membill-save-XXXXXX";
    int fd = mkstemp(tmp);
    if (fd < 0) return -1;
    close(fd);
    int rc = llama_model_save(m, tmp, grads, err);
    FILE *in = rc == 0 ? fopen(tmp, "rb") : NULL;
    char buf[65536];
    size_t n;
    while (in && (n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, f);
    if (in) fclose(in);
    unlink(tmp);
    return rc;
}
