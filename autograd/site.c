// Site labels: "<prefix>:<what>", or the caller's own output label when it holds a colon.
#include <stdio.h>
#include <string.h>

#include "ag_internal.h"

void ag_site_parse(ag_site *s, const char *site) {
    if (!site || !*site) site = "anon";
    const char *colon = strchr(site, ':');
    if (colon) {
        int len = (int)(colon - site);
        snprintf(s->base, sizeof s->base, "%.*s", len, site);
        snprintf(s->out, sizeof s->out, "%s", site); // long labels are cut, not refused
    } else {
        snprintf(s->base, sizeof s->base, "%s", site);
        ag_label(s->out, s->base, "out");
    }
}

int ag_label(char *buf, const char *base, const char *suffix) {
    return snprintf(buf, AG_LABEL_MAX, "%s:%s", base, suffix);
}
