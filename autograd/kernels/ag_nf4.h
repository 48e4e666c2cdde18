// NF4 as bitsandbytes stores a 4-bit weight (quantize_4bit(quant_type="nf4",
// compress_statistics=True), the QLoRA paper's layout): the flattened tensor in blocks of 64, each
// element the index of the nearest of the 16 NF4 code values once divided by its block's absmax,
// two a byte (element 2i in the high nibble); the absmaxes themselves double-quantised: their mean
// taken off (the offset), then 8 bits each in blocks of 256 against bitsandbytes' signed dynamic
// map, with a float32 absmax per block of 256.
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define AG_NF4_BLOCK 64
#define AG_NF4_BLOCK2 256

// The 16 NF4 values (bitsandbytes' get_4bit_type("nf4")), ascending.
extern const float ag_nf4_code[16];

// bitsandbytes' create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): 256 sorted
// float32 values in [-1, 1], the code of the second-level (8-bit) quantisation. (PyTorch's
// vectorised linspace rounds a few of them an ulp away from the formula, by SIMD width.)
void ag_dynamic_map(float code[256]);

// What one quantised tensor of n elements holds, in bytes, as bitsandbytes keeps it in memory.
typedef struct {
    uint64_t blocks;  // ceil(n / 64): absmaxes
    uint64_t blocks2; // ceil(blocks / 256): second-level absmaxes
    uint64_t packed;  // ceil(n / 2): the 4-bit indices (uint8)
    uint64_t absmax;  // blocks: the 8-bit quantised absmaxes (uint8)
    uint64_t absmax2; // blocks2 x 4: their float32 absmaxes (state2.absmax)
    uint64_t offset;  // 4: the float32 mean taken off the absmaxes
    uint64_t code;    // 16 x 4: the NF4 table its QuantState holds (a tensor per weight)
    uint64_t code2;   // 256 x 4: state2's copy of the dynamic map (copy=True, per weight)
    uint64_t total;   // the sum
    uint64_t paper;   // packed + absmax + absmax2: what the paper's 4.127 bits count
} ag_nf4_layout;

ag_nf4_layout ag_nf4_layout_of(uint64_t n);

// Quantises x[n] into packed[layout.packed], qabsmax[layout.blocks], absmax2[layout.blocks2] and
// *offset. False when out of memory (a float per block of scratch).
bool ag_nf4_quantize(const float *x, int64_t n, uint8_t *packed, uint8_t *qabsmax, float *absmax2, float *offset);
// The float32 values back: out[n].
void ag_nf4_dequantize(const uint8_t *packed, const uint8_t *qabsmax, const float *absmax2, float offset, int64_t n,
                       float *out);

// An NF4 tensor's data (AG_NF4): one block of ag_nf4_layout_of(n).total bytes, its float32 parts
// first so that each is aligned: absmax2[blocks2], offset, code[16], code2[256]; then the packed
// indices[packed] and the 8-bit absmaxes[blocks]. Pointers into one such block:
typedef struct {
    float *absmax2, *offset, *code, *code2;
    uint8_t *packed, *qabsmax;
} ag_nf4_parts;
ag_nf4_parts ag_nf4_parts_of(void *block, uint64_t n);
// x[n] quantised into the block, the two code tables written beside it. False when out of
// memory (the block is then zeros: every value dequantises to 0).
bool ag_nf4_store(void *block, const float *x, int64_t n);
// Elements [start, start + count) of the block's n as float32 (the tables the block holds).
void ag_nf4_range_f32(const void *block, int64_t n, int64_t start, int64_t count, float *out);
