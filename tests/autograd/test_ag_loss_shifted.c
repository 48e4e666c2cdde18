// Qwen (v1)'s loss (--framework pytorch-2.0-qwen: modeling_qwen.py, QWenLMHeadModel.forward):
//   shift_logits = lm_logits[..., :-1, :].contiguous()   a copy when batch > 1, a view at batch 1
//   shift_labels = labels[..., 1:].contiguous()          int64, the same
//   CrossEntropyLoss()(shift_logits.view(-1, V), shift_labels.view(-1))
// on the logits in their own dtype (float16 under DeepSpeed's fp16), float32 under autocast (its
// float32 list: a cast of the N rows first). Backward: NllLossBackward's dense [N, V] gradient
// (its saved labels and total_weight released), LogSoftmaxBackward's (its input and saved result
// released), ToCopyBackward's under autocast, then SliceBackward's zeros of the whole [B, T, V]
// logits. Every allocation and free in order, to the byte, B = 2 or 1, T = 3, V = 5 (N = B * 2);
// the seed d(loss) at the loss's dtype; and the loss and gradients equal transformers' ForCausalLMLoss's in float32.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ag_test_util.h"

enum { T = 3, V = 5 };

typedef struct {
    const char *suffix;
    int64_t bytes; // < 0: a free
} event;

static const int32_t ids[2 * T] = {1, 4, 2, 0, 3, 3};

// A run of the loss on logits [B, T, V] at bits (autocast: bf16 logits under autocast): the
// events from the first after the logits, through backward; the loss and the logits' gradient
// as float32 into loss and grad when given.
static void run(ag_framework fw, int B, int bits, bool autocast, const event *want, size_t n, float *loss,
                float *grad) {
    assert_int_equal(mp_init(&(mp_options){.keep_timeline = true}), MP_OK);
    ag_ctx *ctx = ag_ctx_new();
    ag_ctx_set_framework(ctx, fw);
    ag_precision p = ag_precision_f32();
    if (bits == 16) p.act_bits = p.grad_bits = p.weight_bits = 16, p.fp16 = !autocast, p.autocast = autocast;
    assert_true(ag_ctx_set_precision(ctx, &p));
    ag_tensor *logits = ag_tensor_new(ctx, 3, (int64_t[]){B, T, V}, MP_ACTIVATION, "logits");
    assert_non_null(logits);
    assert_int_equal(logits->bits, bits);
    for (int64_t i = 0; i < logits->numel; i++) ag_set(logits->data, logits->dtype, i, 0.25f * (float)((i * 7) % 11) - 1.0f);
    logits->requires_grad = true;
    size_t from = mp_timeline_count();
    ag_tensor *l = ag_cross_entropy(ctx, "loss", logits, ids);
    assert_non_null(l);
    if (loss) *loss = ag_get(l->data, l->dtype, 0);
    assert_int_equal(ag_backward(ctx, l), AG_OK);
    size_t k = 0;
    for (size_t i = from; i < mp_timeline_count(); i++) {
        const mp_event *e = mp_timeline_get(i);
        const char *name = mp_site_name(e->site);
        if (want && k < n) {
            size_t a = strlen(name), b = strlen(want[k].suffix);
            if (a < b || strcmp(name + a - b, want[k].suffix) || e->bytes != want[k].bytes) {
                for (size_t j = from; j < mp_timeline_count(); j++)
                    print_message("  %s %lld\n", mp_site_name(mp_timeline_get(j)->site),
                                  (long long)mp_timeline_get(j)->bytes);
                fail_msg("event %zu: %s %lld bytes, expected ...%s %lld", k, name, (long long)e->bytes,
                         want[k].suffix, (long long)want[k].bytes);
            }
        }
        k++;
    }
    if (want) assert_int_equal(k, n);
    assert_non_null(logits->grad);
    for (int64_t i = 0; grad && i < logits->numel; i++) grad[i] = ag_get(logits->grad->data, logits->grad->dtype, i);
    ag_release(l);
    ag_tape_clear(ctx);
    ag_release(logits);
    ag_ctx_free(ctx);
    for (int c = 0; c <= MP_OTHER; c++)
        if (c != MP_OTHER) assert_int_equal(mp_get_counter(c).live, 0);
    mp_shutdown();
}

// float16 logits, batch 2 (N = 4): the shifted copies, nothing upcast.
static void test_fp16_batch2(void **s) {
    (void)s;
    const event want[] = {
        {":shift_logits", 4 * V * 2}, {":shift_labels", 4 * 8},  {":log_softmax", 4 * V * 2},
        {"loss:out", 2},                  {":total_weight", 2},      {":shift_logits", -4 * V * 2},
        {"loss:grad", 2},             {":nll_grad", 4 * V * 2},     {":shift_labels", -4 * 8}, {":total_weight", -2},
        {":log_softmax_grad", 4 * V * 2}, {":nll_grad", -4 * V * 2}, {":log_softmax", -4 * V * 2},
        {"logits:grad", 2 * T * V * 2},   {":log_softmax_grad", -4 * V * 2}, {"loss:grad", -2},
    };
    run(AG_FRAMEWORK_PYTORCH_20_QWEN, 2, 16, false, want, sizeof want / sizeof *want, NULL, NULL);
}

// batch 1 (N = 2): the slices are views, nothing copied; SliceBackward still makes [1, T, V].
static void test_fp16_batch1(void **s) {
    (void)s;
    const event want[] = {
        {":log_softmax", 2 * V * 2},      {"loss:out", 2},
        {":total_weight", 2},             {"loss:grad", 2},  {":nll_grad", 2 * V * 2},
        {":total_weight", -2},            {":log_softmax_grad", 2 * V * 2},
        {":nll_grad", -2 * V * 2},        {":log_softmax", -2 * V * 2},
        {"logits:grad", T * V * 2},       {":log_softmax_grad", -2 * V * 2}, {"loss:grad", -2},
    };
    run(AG_FRAMEWORK_PYTORCH_20_QWEN, 1, 16, false, want, sizeof want / sizeof *want, NULL, NULL);
}

// bf16 logits under autocast, batch 1: the rows cast to float32 for log_softmax, the float32
// gradients cast back to bf16 before SliceBackward.
static void test_autocast(void **s) {
    (void)s;
    const event want[] = {
        {":logits_float", 2 * V * 4},          {":log_softmax", 2 * V * 4},
        {":logits_float", -2 * V * 4},         {"loss:out", 4},
        {":total_weight", 4},                  {"loss:grad", 4}, {":nll_grad", 2 * V * 4},
        {":total_weight", -4},                 {":log_softmax_grad", 2 * V * 4},
        {":nll_grad", -2 * V * 4},             {":log_softmax", -2 * V * 4},
        {":log_softmax_grad_cast", 2 * V * 2}, {":log_softmax_grad", -2 * V * 4},
        {"logits:grad", T * V * 2},            {":log_softmax_grad_cast", -2 * V * 2}, {"loss:grad", -4},
    };
    run(AG_FRAMEWORK_PYTORCH_20_QWEN, 1, 16, true, want, sizeof want / sizeof *want, NULL, NULL);
}

// The same loss and gradients as transformers' ForCausalLMLoss, in float32 (the last position's
// gradient zero).
static void test_values(void **s) {
    (void)s;
    for (int B = 1; B <= 2; B++) {
        float la, lb, ga[2 * T * V], gb[2 * T * V];
        run(AG_FRAMEWORK_PYTORCH_20, B, 32, false, NULL, 0, &la, ga);
        run(AG_FRAMEWORK_PYTORCH_20_QWEN, B, 32, false, NULL, 0, &lb, gb);
        assert_float_equal(la, lb, 1e-6);
        assert_true(la > 0.5f);
        for (int i = 0; i < B * T * V; i++) assert_float_equal(ga[i], gb[i], 1e-6);
        for (int j = 0; j < V; j++) assert_float_equal(gb[(T - 1) * V + j], 0.0f, 0.0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_batch2),
        cmocka_unit_test(test_fp16_batch1),
        cmocka_unit_test(test_autocast),
        cmocka_unit_test(test_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
