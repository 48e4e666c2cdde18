// "Did you mean": the name a typo most likely meant, among the options, subcommands or presets.
#include "cli.h"

#include <ctype.h>
#include <string.h>

// Edits from a to b (insertions, deletions, substitutions and swaps of two neighbours, the
// optimal string alignment distance), case aside; past `most` the exact count does not matter.
static size_t distance(const char *a, const char *b, size_t most) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64) return most + 1;
    size_t d[65][65];
    for (size_t i = 0; i <= n; i++) d[i][0] = i;
    for (size_t j = 0; j <= m; j++) d[0][j] = j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t cost = tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]),
                   best = d[i - 1][j - 1] + cost;
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

const char *cli_suggest(const char *typed, const char *(*name)(size_t i), size_t count) {
    size_t len = strlen(typed), most = len < 4 ? 1 : len < 9 ? 2 : 3, best = most + 1;
    const char *found = NULL;
    for (size_t i = 0; i < count; i++) {
        const char *c = name(i);
        size_t d = c ? distance(typed, c, most) : best;
        if (d < best) best = d, found = c;
    }
    return found;
}

const char *cli_did_you_mean(char *buf, size_t len, const char *typed, const char *(*name)(size_t i), size_t count) {
    const char *s = cli_suggest(typed, name, count);
    if (!s) return "";
    snprintf(buf, len, " (did you mean %s?)", s);
    return buf;
}
