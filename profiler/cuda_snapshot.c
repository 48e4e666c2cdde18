// The simulated device as torch.cuda.memory._snapshot() describes a real one (the dict that
// torch/csrc/cuda/Module.cpp builds), pickled as torch.cuda.memory._dump_snapshot writes it, so
// that pytorch.org/memory_viz and torch.cuda._memory_viz read it. Where PyTorch records the Python
// frames that allocated a block, membill puts one frame: filename "membill/<category>", name the
// site, line 0.
#include "cuda_internal.h"
#include "pickle.h"

#include <stdlib.h>
#include <string.h>

static const char *const action_names[CU_NACTIONS] = {"alloc",        "free_requested", "free_completed",
                                                      "segment_alloc", "segment_free",   "segment_map",
                                                      "segment_unmap", "oom"};

static void frames(pk_writer *w, bool have, uint32_t site, uint8_t category) {
    pk_key(w, "frames");
    pk_list_begin(w);
    if (have) {
        char file[64];
        snprintf(file, sizeof file, "membill/%s", mp_category_name((mp_category)category));
        pk_dict_begin(w);
        pk_key(w, "filename");
        pk_str(w, file);
        pk_key(w, "line");
        pk_int(w, 0);
        pk_key(w, "name");
        pk_str(w, mp_site_name(site));
        pk_dict_end(w);
    }
    pk_list_end(w);
}

static void key_int(pk_writer *w, const char *k, int64_t v) {
    pk_key(w, k);
    pk_int(w, v);
}

static cu_block *head_of(const cu_seg *s) {
    cu_block *b = s->any;
    while (b && b->prev) b = b->prev;
    return b;
}

// The snapshot's segments: a cudaMalloc'd segment whole; an expandable segment as each run of
// mapped blocks (as DeviceCachingAllocator::snapshot reports it).
typedef struct {
    const cu_block *head;
    const cu_seg *seg;
} seg_view;

static int by_address(const void *a, const void *b) {
    uint64_t x = ((const seg_view *)a)->head->addr, y = ((const seg_view *)b)->head->addr;
    return (x > y) - (x < y);
}

static size_t collect_segments(const mp_cuda *d, seg_view **out) {
    size_t n = 0, cap = 0;
    seg_view *v = NULL;
    for (size_t i = 0; i < d->nsegs; i++)
        for (const cu_block *b = head_of(d->segs[i]); b; b = b->next) {
            if (!b->mapped || (b->prev && b->prev->mapped)) continue; // not the start of a mapped run
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                seg_view *nv = mp_raw_realloc(v, cap * sizeof *v);
                if (!nv) {
                    mp_raw_free(v);
                    *out = NULL;
                    return SIZE_MAX;
                }
                v = nv;
            }
            v[n++] = (seg_view){b, d->segs[i]};
        }
    if (n) qsort(v, n, sizeof *v, by_address);
    *out = v;
    return n;
}

static void write_segment(pk_writer *w, const seg_view *sv) {
    uint64_t total = 0, allocated = 0, requested = 0;
    for (const cu_block *b = sv->head; b && b->mapped; b = b->next) {
        total += b->size;
        if (b->allocated) allocated += b->size, requested += b->requested;
    }
    pk_dict_begin(w);
    key_int(w, "device", 0);
    key_int(w, "address", (int64_t)sv->head->addr);
    key_int(w, "total_size", (int64_t)total);
    key_int(w, "allocated_size", (int64_t)allocated);
    key_int(w, "active_size", (int64_t)allocated);
    key_int(w, "requested_size", (int64_t)requested);
    key_int(w, "stream", 0);
    pk_key(w, "segment_type");
    pk_str(w, sv->seg->small ? "small" : "large");
    pk_key(w, "segment_pool_id");
    pk_pair(w, 0, 0);
    pk_key(w, "is_expandable");
    pk_bool(w, sv->seg->expandable);
    frames(w, true, sv->seg->site, sv->seg->category);
    pk_key(w, "blocks");
    pk_list_begin(w);
    for (const cu_block *b = sv->head; b && b->mapped; b = b->next) {
        pk_dict_begin(w);
        key_int(w, "address", (int64_t)b->addr);
        key_int(w, "size", (int64_t)b->size);
        key_int(w, "requested_size", (int64_t)(b->allocated ? b->requested : 0));
        pk_key(w, "state");
        pk_str(w, b->allocated ? "active_allocated" : "inactive");
        frames(w, b->allocated, b->site, b->category);
        pk_dict_end(w);
    }
    pk_list_end(w);
    pk_dict_end(w);
}

static void write_trace(pk_writer *w, const mp_cuda *d) {
    pk_list_begin(w); // one device
    pk_list_begin(w);
    for (size_t i = 0; i < d->ntrace; i++) {
        const cu_trace *t = &d->trace[i];
        pk_dict_begin(w);
        pk_key(w, "action");
        pk_str(w, action_names[t->action]);
        key_int(w, t->action == CU_OOM ? "device_free" : "addr", (int64_t)t->addr);
        key_int(w, "size", (int64_t)t->size);
        key_int(w, "stream", 0);
        key_int(w, "time_us", (int64_t)(t->seconds * 1e6));
        frames(w, true, t->site, t->category);
        pk_dict_end(w);
    }
    pk_list_end(w);
    pk_list_end(w);
}

// allocator_settings as the snapshot reports them (max_split_size: -1 when unset, SIZE_MAX as int64).
static void write_settings(pk_writer *w, const mp_cuda_conf *c, const char *conf_text) {
    pk_dict_begin(w);
    pk_key(w, "PYTORCH_CUDA_ALLOC_CONF");
    pk_str(w, conf_text ? conf_text : "");
    key_int(w, "max_split_size", c->max_split_size == UINT64_MAX ? -1 : (int64_t)c->max_split_size);
    pk_key(w, "garbage_collection_threshold");
    pk_float(w, c->garbage_collection_threshold);
    pk_key(w, "expandable_segments");
    pk_bool(w, c->expandable_segments);
    key_int(w, "pinned_num_register_threads", 1);
    pk_key(w, "release_lock_on_cudamalloc");
    pk_bool(w, false);
    pk_key(w, "pinned_use_cuda_host_register");
    pk_bool(w, false);
    pk_key(w, "roundup_power2_divisions");
    pk_dict_begin(w);
    for (int i = 0; i < MP_CUDA_ROUNDUP_INTERVALS; i++) {
        char k[16];
        snprintf(k, sizeof k, "%u", 1u << i);
        key_int(w, k, c->roundup_power2_divisions[i]);
    }
    pk_dict_end(w);
    pk_dict_end(w);
}

int mp_cuda_write_snapshot(const mp_cuda *d, FILE *f, const char *conf_text) {
    if (!d || d->trace_failed) return -1;
    seg_view *segs = NULL;
    size_t n = collect_segments(d, &segs);
    pk_writer *w = n == SIZE_MAX ? NULL : pk_writer_new(f);
    if (!w) {
        mp_raw_free(segs);
        return -1;
    }
    pk_dict_begin(w);
    pk_key(w, "segments");
    pk_list_begin(w);
    for (size_t i = 0; i < n; i++) write_segment(w, &segs[i]);
    pk_list_end(w);
    pk_key(w, "device_traces");
    write_trace(w, d);
    pk_key(w, "allocator_settings");
    write_settings(w, &d->conf, conf_text);
    pk_dict_end(w);
    mp_raw_free(segs);
    return pk_writer_finish(w);
}
