// membill compare: a training step and generation of the same model, side by side.
#include "cli.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t peak[MP_NCATEGORIES];
    mp_moment total;
    char *svg; // this side's chart, drawn while its timeline was alive (--svg only)
    size_t svg_len;
} side;

static void read_side(side *s, const cli_options *o, const char *title, double ymax) {
    for (int c = 0; c < MP_NCATEGORIES; c++) s->peak[c] = mp_get_counter(c).peak;
    s->total = mp_peak();
    if (!o->svg) return;
    FILE *f = open_memstream(&s->svg, &s->svg_len);
    if (!f) return;
    cli_svg_scaled(f, title, ymax);
    fclose(f);
}

static int start_profiler(const cli_options *o) {
    mp_options mo = {.meta = o->meta, .budget = o->budget, .track_other = !o->meta, .keep_timeline = true};
    return mp_init(&mo) == MP_OK ? 0 : -1;
}

// Training first: its total peak sets the common scale of both charts.
static int run_sides(const cli_options *o, train_run *tr, infer_run *ir, side *t, side *g, ag_err *err) {
    if (start_profiler(o) != 0) return -1;
    ag_set_num_threads((int)(o->threads ? o->threads : 2));
    int rc = cli_train_run(o, tr, err);
    double ymax = (double)mp_peak().total;
    if (rc == 0) read_side(t, o, "training step", ymax);
    mp_shutdown();
    if (rc != 0) return -1;
    if (start_profiler(o) != 0) return -1;
    rc = cli_infer_run(o, ir, err);
    if (rc == 0) read_side(g, o, "inference", ymax);
    mp_shutdown();
    return rc;
}

static int svg_pair(FILE *f, void *arg) {
    const side *s = arg;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"2160\" "
               "height=\"560\" font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n");
    for (int i = 0; i < 2; i++) {
        // Each side's own <svg> element nested at its offset, on the same vertical scale.
        const char *body = strstr(s[i].svg ? s[i].svg : "", "<svg");
        if (!body) return -1;
        fprintf(f, "<g transform=\"translate(%d,10)\">\n<svg x=\"0\" y=\"0\"%s\n</g>\n", i * 1080, body + 4);
    }
    fprintf(f, "</svg>\n");
    return 0;
}

static void print_table(FILE *f, const train_run *tr, const infer_run *ir, const side *t, const side *g) {
    char a[64], b[64];
    fprintf(f, "membill compare: %s; training: batch %ld x %ld tokens, %s; inference: batch %ld x %ld-token prompt + %ld new, %s\n\n",
            tr->cfg.name, tr->batch, tr->seq_len, optim_kind_name(tr->ocfg.kind), ir->batch, ir->seq_len, ir->new_tokens,
            ir->use_cache ? "KV cache" : "no cache");
    fprintf(f, "  %-11s %-36s %-36s\n", "category", "training step (peak)", "inference (peak)");
    for (int c = 0; c < MP_NCATEGORIES; c++)
        fprintf(f, "  %-11s %-36s %-36s\n", mp_category_name(c), mp_format_bytes(a, sizeof a, t->peak[c]),
                mp_format_bytes(b, sizeof b, g->peak[c]));
    fprintf(f, "  %-11s %-36s %-36s\n", "total peak", mp_format_bytes(a, sizeof a, t->total.total),
            mp_format_bytes(b, sizeof b, g->total.total));
    fprintf(f, "\n  training needs %.2f x the memory of inference at their peaks\n",
            g->total.total ? (double)t->total.total / (double)g->total.total : 0);
}

static json_t *side_json(const side *s) {
    json_t *o = json_object(), *cats = json_object();
    for (int c = 0; c < MP_NCATEGORIES; c++) json_object_set_new(cats, mp_category_name(c), json_integer((json_int_t)s->peak[c]));
    json_object_set_new(o, "categories", cats);
    json_object_set_new(o, "total_peak_bytes", json_integer((json_int_t)s->total.total));
    json_object_set_new(o, "peak_phase", json_string(mp_phase_name(s->total.phase)));
    return o;
}

int cmd_compare(const cli_options *o) {
    if (o->help) {
        fputs("usage: membill compare [options]\n"
              "A training step and generation of the same model, category by category, with the\n"
              "ratio of their total peaks. Options as for membill train and membill infer\n"
              "(--model, --config, --weights, --seq-len, --batch, --new-tokens, --no-cache, --optimizer,\n"
              "--meta, --json, --svg: both runs as charts on one scale).\n", stdout);
        return 0;
    }
    if (o->timeline || o->trace || o->html || o->dump_grads || o->save_weights) {
        fprintf(stderr, "membill compare: --timeline, --trace, --html, --dump-grads and --save-weights belong to train or infer\n");
        return EXIT_USAGE;
    }
    if (o->dtype || o->weight_dtype || o->checkpointing) {
        fprintf(stderr, "membill compare: runs both sides in float32 without checkpointing; for other settings use membill plan (--dtype, --infer, --checkpointing)\n");
        return EXIT_USAGE;
    }
    train_run tr;
    infer_run ir;
    memset(&tr, 0, sizeof tr);
    ag_err err = {""};
    optim_kind kind = OPTIM_ADAM;
    if (o->optimizer && !optim_parse_kind(o->optimizer, &kind)) {
        fprintf(stderr, "membill compare: --optimizer must be adam, adamw, sgd, sgd-momentum or none, not '%s'\n", o->optimizer);
        return EXIT_USAGE;
    }
    int rc = cli_infer_prepare(o, &ir, &err);
    step_record rec;
    if (rc == 0) {
        tr.cfg = ir.cfg;
        memcpy(tr.st_path, ir.st_path, sizeof tr.st_path);
        tr.ocfg = optim_defaults(kind);
        tr.ocfg.lr = o->lr_given ? (float)o->lr : 1e-5f;
        tr.ids = ir.ids;
        tr.batch = ir.batch;
        tr.seq_len = ir.seq_len;
        tr.steps = &rec;
        tr.nsteps = 1;
        if (ir.mask) {
            ag_err_set(&err, "compare trains on one prompt repeated over --batch: give prompts of one length");
            rc = -1;
        }
    }
    side s[2];
    memset(s, 0, sizeof s);
    if (rc == 0) rc = run_sides(o, &tr, &ir, &s[0], &s[1], &err);
    if (rc != 0) {
        fprintf(stderr, "membill compare: %s\n", err.msg);
    } else {
        if (!o->quiet && !(o->json && strcmp(o->json, "-") == 0)) print_table(stdout, &tr, &ir, &s[0], &s[1]);
        char msg[600];
        if (o->json) {
            json_t *root = cli_report_root(&tr.cfg);
            json_object_set_new(root, "train", side_json(&s[0]));
            json_object_set_new(root, "infer", side_json(&s[1]));
            json_object_set_new(root, "ratio", json_real(s[1].total.total ? (double)s[0].total.total / (double)s[1].total.total : 0));
            if (cli_write_json(o->json, root, msg, sizeof msg) != 0) rc = -1;
            json_decref(root);
        }
        if (rc == 0 && o->svg && cli_write_file(o->svg, svg_pair, s, msg, sizeof msg) != 0) rc = -1;
        if (rc != 0) fprintf(stderr, "membill compare: %s\n", msg);
    }
    free(s[0].svg);
    free(s[1].svg);
    cli_infer_free(&ir);
    return rc == 0 ? 0 : EXIT_RUN_FAILED;
}
