// Broken safetensors files, each built here byte by byte: every one must be refused at open with
// one message naming the file and the tensor or field at fault.
#include "model.h"
#include "test_util.h"

#define HDR_ACTUAL UINT64_MAX // state the true header length

static const struct {
    const char *what;
    uint64_t stated;    // header length written in the first 8 bytes (HDR_ACTUAL: the truth)
    const char *header; // header text
    size_t data;        // bytes of data after it
    const char *expect1, *expect2, *expect3;
} cases[] = {
    {"lying header length", 1000, "{}", 0, "header length 1000", "past the end", NULL},
    {"header length 2^63", 1ULL << 63, "{}", 16, "9223372036854775808", NULL, NULL},
    {"header length 2^64 - 2", UINT64_MAX - 1, "{}", 16, "18446744073709551614", NULL, NULL},
    {"empty header", HDR_ACTUAL, "", 16, "not valid JSON", NULL, NULL},
    {"non-JSON header", HDR_ACTUAL, "this is not json", 0, "not valid JSON", NULL, NULL},
    {"truncated JSON", HDR_ACTUAL, "{\"w\":{\"dtype\":\"F32\",\"sha", 0, "not valid JSON", NULL, NULL},
    {"header is an array", HDR_ACTUAL, "[1,2]", 0, "JSON object", NULL, NULL},
    {"duplicate tensor", HDR_ACTUAL,
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, "not valid JSON", "duplicate", NULL},
    {"integer past 64 bits", HDR_ACTUAL,
     "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,100000000000000000000000]}}", 4, "not valid JSON",
     NULL, NULL},
    {"entry not an object", HDR_ACTUAL, "{\"emb\":5}", 0, "tensor emb", "object", NULL},
    {"empty name", HDR_ACTUAL, "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "empty name", NULL,
     NULL},
    {"unknown dtype F64", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
     "tensor emb", "F64", "expected F32, BF16, F16"},
    {"made-up dtype", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
     "tensor emb", "Q4_K", NULL},
    {"dtype missing", HDR_ACTUAL, "{\"emb\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor emb", "dtype", NULL},
    {"dtype a number", HDR_ACTUAL, "{\"emb\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor emb",
     "dtype", NULL},
    {"shape missing", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor emb", "shape",
     NULL},
    {"shape a string", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"shape\":\"[1]\",\"data_offsets\":[0,4]}}", 4,
     "tensor emb", "shape", NULL},
    {"negative dimension", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
     "tensor emb", "shape", "non-negative"},
    {"fractional dimension", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4,
     "tensor emb", "shape", NULL},
    {"nine dimensions", HDR_ACTUAL,
     "{\"emb\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "tensor emb", "shape",
     "at most 8"},
    {"shape product overflows", HDR_ACTUAL,
     "{\"emb\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}", 16, "tensor emb",
     "[4294967296, 4294967296]", "overflow"},
    {"byte size overflows", HDR_ACTUAL,
     "{\"emb\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,16]}}", 16, "tensor emb",
     "overflow", NULL},
    {"data_offsets missing", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor emb", "data_offsets",
     NULL},
    {"data_offsets reversed", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
     "tensor emb", "data_offsets", NULL},
    {"data_offsets of one", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 8,
     "tensor emb", "data_offsets", NULL},
    {"negative offset", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8,
     "tensor emb", "data_offsets", NULL},
    {"offsets past the data", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[0,24]}}", 16,
     "tensor emb", "past the end", "16 bytes"},
    {"huge offsets", HDR_ACTUAL,
     "{\"emb\":{\"dtype\":\"F32\",\"shape\":[1],"
     "\"data_offsets\":[9223372036854775800,9223372036854775804]}}",
     16, "tensor emb", "past the end", NULL},
    {"byte size not shape x dtype", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}",
     24, "tensor emb", "20 bytes", "needs 24"},
    {"BF16 sized as F32", HDR_ACTUAL, "{\"emb\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16,
     "tensor emb", "BF16", "needs 8"},
    {"overlapping offsets", HDR_ACTUAL,
     "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
     "\"b.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
     24, "a.weight", "b.weight", "overlap"},
    {"same offsets twice", HDR_ACTUAL,
     "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b.weight\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
     8, "a.weight", "b.weight", "overlap"},
};
#define NCASES (sizeof cases / sizeof cases[0])

static void test_corpus(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    for (size_t i = 0; i < NCASES; i++) {
        char file[64];
        snprintf(file, sizeof file, "case%02zu.safetensors", i);
        tu_path(path, sizeof path, dir, file);
        uint64_t stated = cases[i].stated == HDR_ACTUAL ? strlen(cases[i].header) : cases[i].stated;
        tu_write_st(path, stated, cases[i].header, NULL, cases[i].data);
        llama_st_file *f = (llama_st_file *)1;
        ag_err err = {{0}};
        if (llama_st_open(&f, path, &err) != -1) fail_msg("case %s accepted", cases[i].what);
        assert_null(f);
        print_message("%-28s %s\n", cases[i].what, err.msg);
        TU_MENTIONS(err.msg, file, cases[i].expect1, cases[i].expect2, cases[i].expect3);
    }
    tu_rmtree(dir);
}

// The builder itself makes good files: the corpus fails for its faults, not the builder's.
static void test_corpus_control(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "good.safetensors");
    const char *header = "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                         "\"b.weight\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[16,24]},"
                         "\"none\":{\"dtype\":\"F16\",\"shape\":[0,7],\"data_offsets\":[8,8]},"
                         "\"__metadata__\":{\"format\":\"pt\",\"n\":[1,2]}}   ";
    tu_write_st(path, strlen(header), header, NULL, 24);
    llama_st_file *f;
    ag_err err = {{0}};
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    assert_int_equal(llama_st_count(f), 3);
    float b[4];
    assert_int_equal(llama_st_read_f32(f, llama_st_find(f, "b.weight"), b, 4, &err), 0);
    // data byte i holds i: the first bf16 is bytes 16, 17 -> 0x1110
    uint32_t bits = 0x11100000u;
    float want;
    memcpy(&want, &bits, 4);
    assert_true(b[0] == want);
    llama_st_close(f);
    // an empty header is a file with no tensors
    tu_write_st(path, 2, "{}", NULL, 0);
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    assert_int_equal(llama_st_count(f), 0);
    llama_st_close(f);
    tu_rmtree(dir);
}

// Files too short for the length, files that are not files, and a good file cut short.
static void test_short_and_truncated(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    llama_st_file *f;
    ag_err err = {{0}};
    tu_path(path, sizeof path, dir, "empty.safetensors");
    tu_write(path, "", 0);
    assert_int_equal(llama_st_open(&f, path, &err), -1);
    TU_MENTIONS(err.msg, "empty.safetensors", "too short");
    tu_path(path, sizeof path, dir, "five.safetensors");
    tu_write(path, "\x10\0\0\0\0", 5);
    assert_int_equal(llama_st_open(&f, path, &err), -1);
    TU_MENTIONS(err.msg, "five.safetensors", "too short");
    tu_path(path, sizeof path, dir, "absent.safetensors");
    assert_int_equal(llama_st_open(&f, path, &err), -1);
    TU_MENTIONS(err.msg, "absent.safetensors", "cannot open");
    assert_int_equal(llama_st_open(&f, dir, &err), -1);
    TU_MENTIONS(err.msg, dir, "not a regular file");

    // a file written by the writer, then cut: the last tensor's data is gone
    tu_path(path, sizeof path, dir, "cut.safetensors");
    float x[64] = {0};
    const char *names[] = {"model.embed_tokens.weight", "model.norm.weight"};
    const int nd[] = {2, 1};
    const int64_t shapes[][4] = {{8, 4}, {32}};
    const float *data[] = {x, x};
    assert_int_equal(tu_write_f32(path, 2, names, nd, shapes, data, &err), 0);
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    llama_st_close(f);
    size_t len;
    unsigned char *raw = tu_read(path, &len);
    uint64_t hlen = tu_get_le(raw, 8);
    free(raw);
    assert_int_equal(truncate(path, (off_t)(8 + hlen + 128 + 64)), 0); // half of the norm
    assert_int_equal(llama_st_open(&f, path, &err), -1);
    TU_MENTIONS(err.msg, "cut.safetensors", "model.norm.weight", "truncated");
    assert_int_equal(truncate(path, 8 + 20), 0); // into the header
    assert_int_equal(llama_st_open(&f, path, &err), -1);
    TU_MENTIONS(err.msg, "cut.safetensors", "header length");
    tu_rmtree(dir);
}

// Paths that are not regular files are refused at open, at once (a FIFO with no writer would
// otherwise block the open; alarm turns a hang into a failure).
static void test_not_regular_files(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), fifo[8192];
    tu_path(fifo, sizeof fifo, dir, "model.safetensors");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    llama_st_file *f = (llama_st_file *)1;
    ag_err err = {{0}};
    alarm(20);
    assert_int_equal(llama_st_open(&f, fifo, &err), -1);
    assert_null(f);
    TU_MENTIONS(err.msg, fifo, "not a regular file", "FIFO");
    for (const char *const *dev = tu_char_devices(); *dev; dev++) {
        assert_int_equal(llama_st_open(&f, *dev, &err), -1);
        TU_MENTIONS(err.msg, *dev, "not a regular file", "character device");
    }
    assert_int_equal(llama_st_open(&f, dir, &err), -1);
    TU_MENTIONS(err.msg, dir, "folder");
    // the helper itself: the descriptor and size of a regular file
    char good[8192];
    tu_path(good, sizeof good, dir, "good.safetensors");
    tu_write_st(good, 2, "{}", NULL, 6);
    uint64_t size = 0;
    int fd = llama_open_regular(good, &size, &err);
    assert_true(fd >= 0);
    assert_int_equal(size, 16);
    close(fd);
    assert_int_equal(llama_open_regular(fifo, &size, &err), -1);
    TU_MENTIONS(err.msg, "FIFO");
    alarm(0);
    tu_rmtree(dir);
}

// A file that shrinks while open: every read past the new end fails naming file and tensor,
// reads before it still work, and nothing raises SIGBUS (what a mapping did).
static void test_truncated_while_open(void **state) {
    (void)state;
    char *dir = tu_tmpdir(), path[8192];
    tu_path(path, sizeof path, dir, "shrinks.safetensors");
    // F32 [4] at 0, BF16 [4] at 16, F16 [2] at 24, I32 [2] at 28, I64 [2] at 36: 52 bytes
    const char header[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                          "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                          "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[24,28]},"
                          "\"i\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[28,36]},"
                          "\"l\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[36,52]}}";
    size_t hlen = strlen(header);
    tu_write_st(path, hlen, header, NULL, 52);
    llama_st_file *f;
    ag_err err = {{0}};
    assert_int_equal(llama_st_open(&f, path, &err), 0);
    float fl[4];
    int64_t il[2];
    // before: every tensor reads, the 16-bit and 32-bit ones widened in place
    assert_int_equal(llama_st_read_f32(f, llama_st_find(f, "b"), fl, 4, &err), 0);
    uint32_t bits = 0x11100000u; // data byte k holds k: bytes 16, 17
    float want;
    memcpy(&want, &bits, 4);
    assert_true(fl[0] == want);
    assert_int_equal(llama_st_read_i64(f, llama_st_find(f, "i"), il, 2, &err), 0);
    assert_int_equal(il[0], 0x1f1e1d1c);
    assert_int_equal(il[1], 0x23222120);

    // cut inside "h": a, b still read; h, i, l fail
    assert_int_equal(truncate(path, (off_t)(8 + hlen + 26)), 0);
    assert_int_equal(llama_st_read_f32(f, llama_st_find(f, "a"), fl, 4, &err), 0);
    assert_int_equal(llama_st_read_f32(f, llama_st_find(f, "b"), fl, 4, &err), 0);
    const char *gone[] = {"h", "i", "l"};
    for (int k = 0; k < 3; k++) {
        const llama_st_tensor *t = llama_st_find(f, gone[k]);
        memset(&err, 0, sizeof err);
        int rc = t->dtype == LLAMA_ST_F16 ? llama_st_read_f32(f, t, fl, 2, &err) : llama_st_read_i64(f, t, il, 2, &err);
        assert_int_equal(rc, -1);
        char tensor[32];
        snprintf(tensor, sizeof tensor, "tensor %s", gone[k]);
        TU_MENTIONS(err.msg, "shrinks.safetensors", tensor, "truncated");
    }
    print_message("%s\n", err.msg);
    // to nothing at all
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(llama_st_read_f32(f, llama_st_find(f, "a"), fl, 4, &err), -1);
    TU_MENTIONS(err.msg, "shrinks.safetensors", "tensor a", "ends at byte 0");
    llama_st_close(f);
    // the cut file no longer opens
    assert_int_equal(llama_st_open(&f, path, &err), -1);
    TU_MENTIONS(err.msg, "too short");
    tu_rmtree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_corpus_control),
        cmocka_unit_test(test_short_and_truncated),
        cmocka_unit_test(test_not_regular_files),
        cmocka_unit_test(test_truncated_while_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
