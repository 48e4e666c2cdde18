// The size parser of --budget (mp_parse_bytes) on arbitrary text.
#include <math.h>

#include "fuzz_util.h"
#include "profiler.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    FZ_REQUIRE(text);
    memcpy(text, data, size);
    text[size] = '\0';
    uint64_t v = 0;
    bool ok = mp_parse_bytes(text, &v);
    FZ_REQUIRE(mp_parse_bytes(text, &v) == ok); // no hidden state
    if (ok) {
        // every unit is at least one byte: the result is at least the number written, up to 2^64
        double d = strtod(text, NULL);
        FZ_REQUIRE((double)v + 0.5 >= d);
    }
    free(text);
    return 0;
}
