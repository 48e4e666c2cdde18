// Site labels: "<prefix>:<what>", or the caller's own output label when it holds a colon.
#include <string.h>

#include "ag_internal.h"

size_t ag_str_put(char *buf, size_t cap, size_t n, const char *s) {
    size_t len = strlen(s);
    if (n < cap) {
        size_t k = len < cap - 1 - n ? len : cap - 1 - n;
        memcpy(buf + n, s, k);
        buf[n + k] = '\0';
    }
    return n + len;
}

size_t ag_str_put_i64(char *buf, size_t cap, size_t n, long long v) {
    char d[24], *p = d + sizeof d;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    *--p = '\0';
    do *--p = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0) *--p = '-';
    return ag_str_put(buf, cap, n, p);
}

void ag_site_parse(ag_site *s, const char *site) {
    if (!site || !*site) site = "anon";
    const char *colon = strchr(site, ':');
    if (colon) {
        size_t len = (size_t)(colon - site), k = len < sizeof s->base - 1 ? len : sizeof s->base - 1;
        memcpy(s->base, site, k);
        s->base[k] = '\0';
        ag_str_put(s->out, sizeof s->out, 0, site); // long labels are cut, not refused
    } else {
        ag_str_put(s->base, sizeof s->base, 0, site);
        ag_label(s->out, s->base, "out");
    }
}

int ag_label(char *buf, const char *base, const char *suffix) {
    size_t n = ag_str_put(buf, AG_LABEL_MAX, 0, base);
    n = ag_str_put(buf, AG_LABEL_MAX, n, ":");
    return (int)ag_str_put(buf, AG_LABEL_MAX, n, suffix);
}
