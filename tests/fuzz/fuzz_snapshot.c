// The snapshot reader (mp_snapshot_parse: a strict pickle reader and the snapshot's schema) on
// arbitrary bytes: it refuses in one line or returns figures that hold together, never runs,
// crashes or hangs.
#include "fuzz_util.h"
#include "profiler.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[300] = "";
    mp_snapshot *s = mp_snapshot_parse(data, size, err, sizeof err);
    if (!s) {
        fz_check_message(err, NULL);
        return 0;
    }
    for (size_t i = 0; i < mp_snapshot_devices(s); i++) {
        const mp_snapshot_device *d = mp_snapshot_device_at(s, i);
        FZ_REQUIRE(d->requested_peak_bytes >= d->requested_bytes);
        FZ_REQUIRE(d->reserved_peak_bytes >= d->reserved_bytes);
        mp_snapshot_point pts[16];
        size_t n = mp_snapshot_timeline(s, i, pts, 16);
        FZ_REQUIRE(n <= 16);
        for (size_t k = 0; k < n; k++) {
            FZ_REQUIRE(pts[k].requested <= d->requested_peak_bytes);
            FZ_REQUIRE(pts[k].reserved <= d->reserved_peak_bytes);
        }
        mp_snapshot_block b[8];
        size_t live = mp_snapshot_largest(s, i, b, 8);
        for (size_t k = 1; k < live && k < 8; k++) FZ_REQUIRE(b[k - 1].bytes >= b[k].bytes);
    }
    mp_snapshot_free(s);
    return 0;
}
