// profiler: tagged allocation over jemalloc, with counters, peaks, a timeline and reports.
//
// Every tensor byte goes through mp_alloc/mp_free with a category and a site label. Each
// category has its own jemalloc arena, so jemalloc's per-arena statistics are an independent
// check of the counters kept here. The profiler is one process-wide instance (mp_init ..
// mp_shutdown); every entry point takes its lock, so any thread may allocate and read, and plain
// malloc calls from any thread are billed to "other" through jemalloc's allocation hooks where
// they exist.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

// temporary: scratch that is neither saved for backward, nor a gradient, nor optimizer state
// (an optimizer's per-step temporaries, the autograd engine's out-of-place gradient sums), as
// PyTorch's memory profiler calls it TEMPORARY.
typedef enum {
    MP_WEIGHT,
    MP_GRADIENT,
    MP_OPTIMIZER,
    MP_ACTIVATION,
    MP_CACHE,
    MP_TEMPORARY,
    MP_OTHER,
    MP_NCATEGORIES
} mp_category;

typedef enum {
    MP_PHASE_SETUP, // before any named phase: parsing arguments, config
    MP_PHASE_LOAD,
    MP_PHASE_ZERO_GRAD, // optimizer.zero_grad(set_to_none=True) at the start of a step
    MP_PHASE_FORWARD,
    MP_PHASE_BACKWARD,
    MP_PHASE_OPTIMIZER,
    MP_PHASE_PREFILL,
    MP_PHASE_DECODE,
    MP_PHASE_TEARDOWN,
    MP_NPHASES
} mp_phase;

typedef enum {
    MP_OK = 0,
    MP_ERR_BUDGET,  // the allocation would cross the budget, or plain malloc already did: see mp_oom()
    MP_ERR_NOMEM,   // the allocator itself failed
    MP_ERR_INVALID, // bad argument (absurd size, unknown category)
    MP_ERR_STATE,   // not initialised, or initialised twice
} mp_status;

// One billed allocation. Its owner keeps it and hands it back to mp_free. In meta mode data
// is NULL: the bytes are counted exactly as in a real run, but no memory is taken.
typedef struct {
    void *data;
    size_t bytes;  // requested
    size_t usable; // what the allocator gave (size class); equal to bytes in meta mode
    uint32_t site;   // interned site label, see mp_site_name
    uint32_t serial; // this allocation's number in the run (1, 2, ...), on its timeline events
    uint8_t category;
    bool host; // made in host memory (mp_set_host): counted apart from the device's bill
} mp_block;

typedef struct {
    bool meta; // count without allocating
    // 0: none. Compared with the same total the peak is taken from: the live requested bytes of
    // the tensor categories plus "other" (plain malloc, when tracked). A run passes when its
    // total peak is at most the budget.
    uint64_t budget;
    bool track_other;   // bill plain malloc to "other" (jemalloc hooks, when available)
    bool keep_timeline; // record every event (time, phase, site, category, bytes)
} mp_options;

typedef struct {
    uint64_t live, peak;               // requested bytes
    uint64_t live_usable, peak_usable; // allocator size classes
    uint64_t allocations, frees;
    size_t peak_events; // timeline events up to the moment of the peak (see mp_sites_live_at)
} mp_counter;

// A snapshot of what every category held at one instant.
typedef struct {
    uint64_t bytes[MP_NCATEGORIES];
    uint64_t total;
    mp_phase phase;
    // The tensor allocation that made this moment; when plain malloc made it (by_malloc), the
    // last tensor allocated before it (0, "(none)", if there was none yet).
    uint32_t site;
    bool by_malloc;
    double seconds; // since mp_init
    size_t events;  // timeline events recorded up to and including this moment
} mp_moment;

typedef struct {
    uint64_t peak;    // total live requested bytes, highest while the phase was current
    double seconds;   // time spent in the phase
    uint32_t entries; // times the phase was entered
    mp_moment at_peak;
} mp_phase_stats;

// Process figures read at a checkpoint.
typedef struct {
    uint64_t rss, hwm;          // VmRSS, VmHWM
    uint64_t jemalloc_resident; // stats.resident (0 when not available)
    uint64_t jemalloc_allocated;
    // VmRSS minus jemalloc's resident bytes read at the same checkpoint: memory jemalloc never
    // saw (OpenBLAS buffers, code, stacks). In mp_process_peak, the largest seen.
    uint64_t untracked;
} mp_process;

// An allocation past the budget. A tensor's (mp_alloc) is refused before it is made: nothing is
// counted, and a later allocation that fits still succeeds. Plain malloc's (category MP_OTHER,
// site "malloc", seen by a hook once it happened) cannot be refused: the live total went past
// the budget, this first one is recorded, and every later mp_alloc returns MP_ERR_BUDGET.
typedef struct {
    bool happened; // the run went past its budget, or asked to
    mp_category category;
    uint32_t site;
    uint64_t requested; // bytes asked (usable bytes for plain malloc)
    uint64_t budget;
    mp_moment live; // what was live just before it (live.site: the last tensor, for plain malloc)
} mp_oom_record;

// One entry of the timeline.
typedef struct {
    double seconds;
    int64_t bytes; // + allocation, - free (requested bytes)
    uint32_t site;
    uint32_t detail; // what the block holds (mp_detail_name), 0: nothing said; allocations only
    uint32_t serial; // the allocation's serial (mp_block), on its allocation and its free; 0 for plain malloc
    uint8_t category;
    uint8_t phase;
} mp_event;

// The cross-check of the counters against jemalloc's own per-arena statistics.
typedef struct {
    bool available; // false in the sanitizer build or without stats
    bool agrees;
    int64_t difference[MP_NCATEGORIES]; // jemalloc minus profiler, usable bytes
    uint64_t jemalloc_bytes[MP_NCATEGORIES];
} mp_crosscheck;

// Host memory beside the device's (ZeRO-Offload, FSDP's CPUOffloadPolicy): while it is on,
// mp_alloc makes blocks that are host memory. They are counted per category in host counters of
// their own (live, peak, allocations), outside the device's totals, peaks, phases, timeline and
// budget; mp_free takes each block back where it was counted. A real run still allocates them
// (jemalloc's cross-check counts both). Off at mp_init; the previous setting is returned.
bool mp_set_host(bool on);
mp_counter mp_get_host_counter(mp_category c);

// Life cycle. mp_init returns MP_ERR_STATE if already initialised.
mp_status mp_init(const mp_options *opt);
void mp_shutdown(void);
bool mp_active(void);
bool mp_is_meta(void);
const char *mp_backend(void); // "jemalloc" or "system"

// Allocation. On failure *out is zeroed and nothing is counted; past the budget, mp_oom()
// tells what asked and what was live.
mp_status mp_alloc(mp_block *out, size_t bytes, mp_category cat, const char *site);
// The same with a description of what the block holds (a tensor's shape and dtype, say),
// kept on the allocation's timeline event for the trace (mp_detail_name); NULL: none.
mp_status mp_alloc_described(mp_block *out, size_t bytes, mp_category cat, const char *site, const char *detail);
// A timeline event's description; NULL when it has none.
const char *mp_detail_name(uint32_t id);
// Frees and zeroes the block; a zeroed block is ignored.
void mp_free(mp_block *b);

// Site labels are interned: ids are stable until mp_shutdown.
uint32_t mp_site_id(const char *label);
const char *mp_site_name(uint32_t id);

// Phases: each has its own peak and time. Switching phase also records process figures.
void mp_set_phase(mp_phase p);
mp_phase mp_get_phase(void);
const char *mp_phase_name(mp_phase p);
const char *mp_category_name(mp_category c);

// Reading the counters.
mp_counter mp_get_counter(mp_category c);
uint64_t mp_live_total(void);
mp_moment mp_peak(void); // the moment of the total peak, with its composition
mp_phase_stats mp_get_phase_stats(mp_phase p);
// Whether the run went over its budget, and how: mp_oom()->happened. The record is a copy taken
// under the lock, valid until this thread's next call.
const mp_oom_record *mp_oom(void);
uint64_t mp_budget(void);
// Forget the peaks (total, categories and phases) and start them again from what is live now.
void mp_reset_peaks(void);

// Process figures now; the highest seen at any checkpoint so far.
mp_process mp_process_now(void);
mp_process mp_process_peak(void);
bool mp_other_available(void); // whether "other" is really tracked (hooks installed)

// Cross-check against jemalloc. `planted` is added to the profiler's own figure of one
// category before comparing, so a test can prove that a disagreement is seen; pass 0.
mp_crosscheck mp_crosscheck_jemalloc(mp_category planted_cat, int64_t planted);

// Timeline: events recorded so far (empty unless keep_timeline). An event, once recorded, never
// moves or changes: its pointer stays valid until mp_shutdown.
size_t mp_timeline_count(void);
size_t mp_timeline_dropped(void); // events lost to out-of-memory (reported; 0 in any sane run)
const mp_event *mp_timeline_get(size_t i);

// Live requested bytes of each site at a moment of the timeline (the first `events` events),
// largest first, for one category or all (cat = MP_NCATEGORIES). Fills up to cap entries and
// returns how many sites held bytes then. Needs keep_timeline.
typedef struct {
    uint32_t site;
    uint8_t category;
    uint64_t bytes;
} mp_site_bytes;
size_t mp_sites_live_at(size_t events, mp_category cat, mp_site_bytes *out, size_t cap);

// Size parsing for --budget: "16GB", "500MiB", "1e9", "123". Returns false on bad input.
bool mp_parse_bytes(const char *text, uint64_t *out);
// The unit that reads at a glance, beside the exact count: GB from 10^9 bytes, MB from 10^6, kB
// below (decimal units, MB = 10^6 bytes): "2.15 GB (2,152,240,128 bytes)",
// "538.06 MB (538,060,032 bytes)", "4.10 kB (4,096 bytes)".
const char *mp_format_bytes(char *buf, size_t n, uint64_t bytes);

// Reports. The JSON report fills the keys "categories", "peak", "phases", "process",
// "jemalloc" (DESIGN.md) into an existing jansson object; returns 0 or -1.
struct json_t;
int mp_report_json(struct json_t *root);
void mp_report_text(FILE *f);

// ---- the device: PyTorch's CUDA caching allocator replayed over the same allocations ----
//
// mp_cuda replays the tensor allocations of a run (the timeline's, or any stream of them) through
// the rules of c10/cuda/CUDACachingAllocator.cpp: sizes rounded up to 512 bytes, a small pool
// (requests up to 1 MiB, carved from 2 MiB segments) and a large pool (1 to 10 MiB requests from
// 20 MiB segments, larger ones rounded up to 2 MiB), best fit among the cached free blocks with
// splitting, freed blocks kept cached and merged with free neighbours, and segments handed back to
// the device only when an allocation would not fit otherwise. It reports what
// torch.cuda.max_memory_allocated (block bytes) and max_memory_reserved (segment bytes) would,
// and every block keeps its category and site. A device that is out of memory fails the
// allocation that asked, as PyTorch raises OutOfMemoryError.

// The allocator's settings, as PYTORCH_CUDA_ALLOC_CONF gives them (mp_cuda_parse_conf).
#define MP_CUDA_ROUNDUP_INTERVALS 16 // 1 MiB, 2 MiB, ... 32 GiB and beyond: one per power of two
typedef struct {
    bool expandable_segments;
    uint64_t max_split_size;         // blocks this large are never split; UINT64_MAX: no limit
    uint64_t max_non_split_rounding; // an oversize block serves requests up to this much smaller (20 MiB)
    uint32_t roundup_power2_divisions[MP_CUDA_ROUNDUP_INTERVALS]; // 0: round to 512 bytes only
    double garbage_collection_threshold; // 0: off; acts only under a memory fraction
    // The device: the bytes the allocator can get from it (the card's total memory less the
    // context, NCCL's buffers and what else the process holds), 0 for no limit; and
    // torch.cuda.set_per_process_memory_fraction's fraction of total_bytes (0: not set).
    uint64_t capacity, total_bytes;
    double memory_fraction;
    // torch.cuda.memory._record_memory_history: keep every action for a snapshot's device_traces
    // (without it a snapshot has the segments alone, as PyTorch's)
    bool record_history;
} mp_cuda_conf;

// PyTorch's defaults: nothing set.
void mp_cuda_conf_default(mp_cuda_conf *c);
// A PYTORCH_CUDA_ALLOC_CONF value ("expandable_segments:True,max_split_size_mb:128", ...) over
// *c, with PyTorch's own checks; false with one line in err (the key at fault) on bad input.
// Keys that do not change where blocks go (backend:native, release_lock_on_cudamalloc, the pinned
// memory ones) are accepted and ignored; backend:cudaMallocAsync is refused (not this allocator).
bool mp_cuda_parse_conf(const char *text, mp_cuda_conf *c, char *err, size_t errlen);

typedef struct {
    // now, and their highest since mp_cuda_new (peak) and since the last window (window_peak)
    uint64_t allocated, reserved, requested, inactive_split, active_blocks, segments;
    uint64_t allocated_peak, reserved_peak, requested_peak, inactive_split_peak;
    uint64_t window_allocated_peak, window_reserved_peak, window_requested_peak;
    // the inactive split bytes at the moment reserved reached its peak, and the timeline event
    // (the allocation that made the segment) of that moment
    uint64_t inactive_split_at_reserved_peak;
    size_t reserved_peak_event;
    uint64_t segment_allocs, segment_frees, alloc_retries, ooms;
} mp_cuda_stats;

// What an allocation the device could not hold asked for, as PyTorch's OutOfMemoryError says it.
typedef struct {
    bool happened;
    uint64_t requested, segment_bytes; // the tensor's bytes, the segment it needed
    uint8_t category;
    uint32_t site;
    size_t event; // the timeline event that asked (timeline replays)
    uint64_t allocated, reserved;
} mp_cuda_oom;

typedef struct mp_cuda mp_cuda;
mp_status mp_cuda_new(mp_cuda **out, const mp_cuda_conf *conf);
void mp_cuda_delete(mp_cuda *d);
// One tensor's allocation (serial: its unique id until it is released); MP_ERR_BUDGET when the
// device cannot hold it (mp_cuda_get_oom), MP_ERR_INVALID for a serial already live. Zero bytes
// take no block, as in PyTorch. `seconds`: its time, for the trace.
mp_status mp_cuda_malloc(mp_cuda *d, uint32_t serial, uint64_t bytes, mp_category cat, uint32_t site, double seconds);
// Its release (unknown serials are ignored: a zero-byte tensor, or one freed already).
void mp_cuda_release(mp_cuda *d, uint32_t serial, double seconds);
// torch.cuda.empty_cache(): every cached segment that holds no block goes back to the device.
void mp_cuda_empty_cache(mp_cuda *d, double seconds);
mp_cuda_stats mp_cuda_get_stats(const mp_cuda *d);
const mp_cuda_oom *mp_cuda_get_oom(const mp_cuda *d);
// Starts the window peaks again from what is held now.
void mp_cuda_window(mp_cuda *d);
// The block rules alone, for reports and tests: a request's block size, its pool's segment size.
uint64_t mp_cuda_round_size(const mp_cuda_conf *c, uint64_t bytes);
uint64_t mp_cuda_segment_size(uint64_t rounded);

// Free space that split segments hold (inactive split blocks) beside the tensors around it: for
// each such block, its bytes and the blocks allocated just before and after it in its segment.
typedef struct {
    uint64_t bytes;
    uint32_t before_site, after_site; // 0 ("(none)"): the segment's edge or another free block
    uint8_t before_category, after_category;
    bool before, after;
} mp_cuda_gap;
// Fills up to cap of them, largest first; returns how many there are.
size_t mp_cuda_gaps(const mp_cuda *d, mp_cuda_gap *out, size_t cap);

// The timeline replayed through d (needs keep_timeline): events from d's cursor up to `end`
// (exclusive), tensor categories only. MP_ERR_BUDGET once an allocation did not fit (the
// replay stops there, as the run would have); the cursor is then at that event.
mp_status mp_cuda_replay_to(mp_cuda *d, size_t end);
size_t mp_cuda_cursor(const mp_cuda *d);

// The device's history as torch.cuda.memory._snapshot() returns it, pickled as
// torch.cuda.memory._dump_snapshot writes it (protocol 4): "segments" (each with its "blocks"),
// "device_traces" (alloc, free_requested, free_completed, segment_alloc, segment_free,
// segment_map, segment_unmap) and "allocator_settings"; each block's and event's "frames" name
// its category (filename "membill/<category>") and site (name). conf_text: the settings as given
// (allocator_settings' PYTORCH_CUDA_ALLOC_CONF). Returns 0 or -1 (a write failed).
int mp_cuda_write_snapshot(const mp_cuda *d, FILE *f, const char *conf_text);

// A snapshot read back: membill's, or a user's torch.cuda.memory._dump_snapshot of a real run.
// Its pickle is read as data (pickle.h): anything else is refused, never run. Per device: the
// figures at the end (the segment list), and over the trace (device_traces, replayed backwards
// from the end, so a trace that lost its start to the ring buffer still gives exact figures for
// what it holds): requested bytes (what the allocations asked: memory_viz's "allocated") and
// reserved bytes (segments), at their peaks.
typedef struct {
    int device;
    uint64_t segments, reserved_bytes, allocated_bytes, requested_bytes; // at the end
    uint64_t reserved_peak_bytes, requested_peak_bytes;                 // over the trace and the end
    size_t trace_entries;
    size_t requested_peak_entry, reserved_peak_entry; // the trace entry after which it held; SIZE_MAX: before the trace
    uint64_t allocs, frees, segment_allocs, segment_frees, ooms;
} mp_snapshot_device;

// A block live at the requested peak: its bytes and where it was allocated (the innermost frame,
// "name (filename:line)"; for membill's own, "site (category)").
typedef struct {
    uint64_t bytes, addr;
    char where[200];
} mp_snapshot_block;

typedef struct {
    size_t entry; // after this trace entry (SIZE_MAX: before the first)
    int64_t time_us;
    uint64_t requested, reserved;
} mp_snapshot_point;

typedef struct mp_snapshot mp_snapshot;
// NULL with one line in err on a file that is not a snapshot (bad pickle, unknown opcode, a
// missing or malformed key, sizes past 2^50, a trace that disagrees with the segment list).
mp_snapshot *mp_snapshot_parse(const uint8_t *data, size_t n, char *err, size_t errlen);
void mp_snapshot_free(mp_snapshot *s);
size_t mp_snapshot_devices(const mp_snapshot *s);
const mp_snapshot_device *mp_snapshot_device_at(const mp_snapshot *s, size_t i);
// The largest blocks live at device i's requested peak, largest first (up to cap); how many were live.
size_t mp_snapshot_largest(const mp_snapshot *s, size_t i, mp_snapshot_block *out, size_t cap);
// Up to cap points of device i's trace, evenly spread, its two peaks among them; how many filled.
size_t mp_snapshot_timeline(const mp_snapshot *s, size_t i, mp_snapshot_point *out, size_t cap);
