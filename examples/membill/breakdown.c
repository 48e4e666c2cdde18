// Which tensors held the memory: the sites live at a moment, summed across blocks
// ("layers.12.mlp.down_proj:out" counts under "layers.*.mlp.down_proj:out" and block 12).
#include "cli.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KINDS 4096

// The block of a "layers.<n>." label (-1 for none); `kind` gets the label with <n> as "*".
static long block_of(const char *site, char *kind, size_t len) {
    size_t skip = strncmp(site, "model.", 6) == 0 ? 6 : 0; // parameter names
    const char *p = strncmp(site + skip, "layers.", 7) == 0 ? site + skip + 7 : NULL;
    char *end = NULL;
    long b = p ? strtol(p, &end, 10) : -1;
    if (!p || end == p || *end != '.') {
        snprintf(kind, len, "%s", site);
        return -1;
    }
    snprintf(kind, len, "%.*slayers.*%s", (int)skip, site, end);
    return b;
}

static int by_bytes(const void *a, const void *b) {
    uint64_t x = ((const cli_site_row *)a)->bytes, y = ((const cli_site_row *)b)->bytes;
    return (x < y) - (x > y);
}

// FNV-1a of a kind and its category: the slot where its row is looked up first.
static size_t kind_hash(const char *kind, int category) {
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)category;
    for (const unsigned char *p = (const unsigned char *)kind; *p; p++) h = (h ^ *p) * 1099511628211ULL;
    return (size_t)h;
}

size_t cli_breakdown(size_t events, mp_category cat, cli_site_row *rows, size_t cap, uint64_t *per_block, long layers) {
    size_t n = mp_sites_live_at(events, cat, NULL, 0);
    mp_site_bytes *sites = n ? malloc(n * sizeof *sites) : NULL;
    // rows by (kind, category): a mixture of experts has thousands of kinds (one an expert)
    size_t slots = 16;
    while (slots < 2 * cap) slots *= 2;
    size_t *index = calloc(slots, sizeof *index); // row + 1; 0: empty
    if ((n && !sites) || !index) {
        free(sites), free(index);
        return 0;
    }
    n = mp_sites_live_at(events, cat, sites, n);
    size_t nrows = 0;
    if (per_block) memset(per_block, 0, (size_t)layers * sizeof *per_block);
    for (size_t i = 0; i < n; i++) {
        char kind[CLI_KIND_MAX];
        long b = block_of(mp_site_name(sites[i].site), kind, sizeof kind);
        if (per_block && b >= 0 && b < layers) per_block[b] += sites[i].bytes;
        size_t slot = kind_hash(kind, sites[i].category) & (slots - 1), j = nrows;
        for (; index[slot]; slot = (slot + 1) & (slots - 1)) {
            const cli_site_row *r = &rows[index[slot] - 1];
            if (r->category == sites[i].category && strcmp(r->kind, kind) == 0) {
                j = index[slot] - 1;
                break;
            }
        }
        if (j == nrows) {
            if (nrows == cap) continue;
            snprintf(rows[j].kind, sizeof rows[j].kind, "%s", kind);
            rows[j].category = sites[i].category;
            rows[j].bytes = 0;
            rows[j].sites = 0;
            index[slot] = ++nrows;
        }
        rows[j].bytes += sites[i].bytes;
        rows[j].sites++;
    }
    free(sites);
    free(index);
    qsort(rows, nrows, sizeof *rows, by_bytes);
    return nrows;
}

static uint64_t sum_rows(const cli_site_row *rows, size_t n) {
    uint64_t t = 0;
    for (size_t i = 0; i < n; i++) t += rows[i].bytes;
    return t;
}

static void print_rows(FILE *f, const cli_site_row *rows, size_t n, size_t top) {
    uint64_t total = sum_rows(rows, n);
    char b[64];
    for (size_t i = 0; i < n && i < top; i++)
        fprintf(f, "    %-46s %-10s %-34s %5.1f%%  (%zu site%s)\n", rows[i].kind, mp_category_name(rows[i].category),
                mp_format_bytes(b, sizeof b, rows[i].bytes), total ? 100.0 * (double)rows[i].bytes / (double)total : 0,
                rows[i].sites, rows[i].sites == 1 ? "" : "s");
    if (n > top) fprintf(f, "    ... and %zu more\n", n - top);
}

void cli_breakdown_text(FILE *f, long layers) {
    static cli_site_row rows[MAX_KINDS];
    mp_moment pk = mp_peak();
    size_t n = cli_breakdown(pk.events, MP_NCATEGORIES, rows, MAX_KINDS, NULL, 0);
    if (!n) return;
    fprintf(f, "\n  held at the total peak (phase %s), summed over blocks:\n", mp_phase_name(pk.phase));
    print_rows(f, rows, n, 8);
    mp_counter act = mp_get_counter(MP_ACTIVATION);
    uint64_t *blocks = calloc((size_t)(layers > 0 ? layers : 1), sizeof *blocks);
    n = cli_breakdown(act.peak_events, MP_ACTIVATION, rows, MAX_KINDS, blocks, layers);
    if (n && blocks) {
        char b[64];
        fprintf(f, "\n  activations at their own peak (%s), by op:\n", mp_format_bytes(b, sizeof b, act.peak));
        print_rows(f, rows, n, 10);
        fprintf(f, "  and by block (MB):");
        for (long i = 0; i < layers && i < 200; i++)
            fprintf(f, "%s%.2f", i % 10 ? " " : "\n    ", (double)blocks[i] / 1e6);
        fprintf(f, "\n");
    }
    free(blocks);
}

static json_t *rows_json(const cli_site_row *rows, size_t n) {
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "site", json_string(rows[i].kind));
        json_object_set_new(o, "category", json_string(mp_category_name(rows[i].category)));
        json_object_set_new(o, "bytes", json_integer((json_int_t)rows[i].bytes));
        json_object_set_new(o, "sites", json_integer((json_int_t)rows[i].sites));
        json_array_append_new(arr, o);
    }
    return arr;
}

json_t *cli_breakdown_json(long layers) {
    static cli_site_row rows[MAX_KINDS];
    json_t *o = json_object();
    mp_moment pk = mp_peak();
    size_t n = cli_breakdown(pk.events, MP_NCATEGORIES, rows, MAX_KINDS, NULL, 0);
    json_object_set_new(o, "at_total_peak", rows_json(rows, n));
    uint64_t *blocks = calloc((size_t)(layers > 0 ? layers : 1), sizeof *blocks);
    n = cli_breakdown(mp_get_counter(MP_ACTIVATION).peak_events, MP_ACTIVATION, rows, MAX_KINDS, blocks, layers);
    json_object_set_new(o, "activation_by_op", rows_json(rows, n));
    json_t *arr = json_array();
    for (long i = 0; blocks && i < layers; i++) json_array_append_new(arr, json_integer((json_int_t)blocks[i]));
    json_object_set_new(o, "activation_by_block", arr);
    free(blocks);
    return o;
}

// "2.38 GB": the figure without the exact count, for a line that names several.
const char *cli_short_bytes(char *buf, size_t n, uint64_t bytes) {
    mp_format_bytes(buf, n, bytes);
    char *cut = strstr(buf, " (");
    if (cut) *cut = 0;
    return buf;
}

void cli_above_four_copies_text(FILE *f, const char *indent, uint64_t peak, const uint64_t at_peak[MP_NCATEGORIES],
                                uint64_t four, size_t events) {
    if (peak <= four) return;
    static cli_site_row rows[MAX_KINDS];
    char a[64], b[64];
    fprintf(f, "%stotal peak %s is %s above the four copies:", indent, cli_short_bytes(a, sizeof a, peak),
            cli_short_bytes(b, sizeof b, peak - four));
    // The categories beyond the model states, largest first, the first with its largest site
    // (but "other": plain malloc's one site is "malloc").
    int order[MP_NCATEGORIES], n = 0;
    for (int c = 0; c < MP_NCATEGORIES; c++)
        if (c != MP_WEIGHT && c != MP_GRADIENT && c != MP_OPTIMIZER && at_peak[c]) order[n++] = c;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && at_peak[order[j]] > at_peak[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s %s %s", i ? "," : "", cli_short_bytes(a, sizeof a, at_peak[order[i]]), mp_category_name(order[i]));
        size_t k = i == 0 && order[i] != MP_OTHER ? cli_breakdown(events, order[i], rows, MAX_KINDS, NULL, 0) : 0;
        if (k) fprintf(f, " (largest %s, %s)", rows[0].kind, cli_short_bytes(b, sizeof b, rows[0].bytes));
    }
    uint64_t states = at_peak[MP_WEIGHT] + at_peak[MP_GRADIENT] + at_peak[MP_OPTIMIZER];
    fprintf(f, "%s held then", n ? "" : " nothing else");
    if (states < four)
        fprintf(f, ", with the model states %s short of the four copies", cli_short_bytes(a, sizeof a, four - states));
    fprintf(f, "\n");
}
