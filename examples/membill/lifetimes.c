// The timeline as lifetimes: each allocation paired with the free that ended it, so that a page
// or a trace can say which tensors were live at any moment. The profiler's events carry no
// allocation id, so a free is paired with the latest open allocation of the same site, category
// and size: which of two such tensors a free ends cannot change what any moment held.
#include "cli.h"
#include "outputs.h"

#include <stdlib.h>

typedef struct {
    uint32_t site;
    uint8_t category;
    int64_t bytes;
    size_t top; // 1 + the latest open lifetime of this key; 0: none open
} open_key;

typedef struct {
    open_key *slots;
    size_t mask;
    size_t *below; // per lifetime: 1 + the open lifetime of its key under it
} open_table;

static size_t hash_key(uint32_t site, uint8_t cat, int64_t bytes) {
    uint64_t h = (uint64_t)site * 0x9E3779B97F4A7C15ull ^ (uint64_t)bytes * 0xC2B2AE3D27D4EB4Full ^ cat;
    return (size_t)(h ^ (h >> 29));
}

// The slot of a key: found, or the empty one where it goes (the table is never more than half full).
static open_key *slot_of(open_table *t, uint32_t site, uint8_t cat, int64_t bytes) {
    for (size_t i = hash_key(site, cat, bytes) & t->mask;; i = (i + 1) & t->mask) {
        open_key *k = &t->slots[i];
        if (!k->bytes || (k->site == site && k->category == cat && k->bytes == bytes)) return k;
    }
}

static void pair_event(open_table *t, cli_lifetime *out, size_t *n, const mp_event *e, size_t i) {
    int64_t size = e->bytes < 0 ? -e->bytes : e->bytes;
    open_key *k = slot_of(t, e->site, e->category, size);
    if (e->bytes < 0 && k->top) { // a free: it ends the latest open lifetime of its key
        size_t l = k->top - 1;
        out[l].end = i;
        k->top = t->below[l];
        return;
    }
    // An allocation, or a free with nothing open to end (kept as a negative lifetime to the end,
    // so that every moment's sums stay those of the events).
    out[*n] = (cli_lifetime){e->site, e->category, e->bytes, i, CLI_LIVE_TO_END, e->detail};
    if (e->bytes > 0) {
        *k = (open_key){e->site, e->category, size, k->top};
        t->below[*n] = k->top;
        k->top = *n + 1;
    }
    (*n)++;
}

cli_lifetime *cli_lifetimes(size_t n, size_t *count) {
    size_t cap = 16, got = 0;
    while (cap < 2 * n) cap *= 2;
    open_table t = {calloc(cap, sizeof *t.slots), cap - 1, calloc(n + 1, sizeof *t.below)};
    cli_lifetime *out = calloc(n + 1, sizeof *out);
    if (t.slots && t.below && out)
        for (size_t i = 0; i < n; i++) {
            const mp_event *e = mp_timeline_get(i);
            if (e->bytes) pair_event(&t, out, &got, e, i);
        }
    free(t.slots);
    free(t.below);
    if (!t.slots || !t.below) {
        free(out);
        out = NULL;
    }
    *count = got;
    return out;
}
