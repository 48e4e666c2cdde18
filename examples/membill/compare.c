// membill compare: a training step and generation of the same model, side by side.
#include "cli.h"
#include "outputs.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t peak[MP_NCATEGORIES];
    mp_moment total;
    char *svg; // this side's chart, drawn while its timeline was alive (--svg only)
    size_t svg_len;
    char *html; // this side's run for the page (--html only), likewise
    size_t html_len;
} side;

static void read_side(side *s, const cli_options *o, const char *title, double ymax) {
    for (int c = 0; c < MP_NCATEGORIES; c++) s->peak[c] = mp_get_counter(c).peak;
    s->total = mp_peak();
    FILE *f = o->html ? open_memstream(&s->html, &s->html_len) : NULL;
    if (f && cli_html_run_data(f, title) != 0) s->html_len = 0;
    if (f) fclose(f);
    f = o->svg ? open_memstream(&s->svg, &s->svg_len) : NULL;
    if (!f) return;
    cli_svg_chart(f, title, ymax, true);
    fclose(f);
}

// With --lora: full fine-tune, LoRA, QLoRA (the same adapters on a low-bit base) and inference;
// without: training and inference.
#define MAX_SIDES 4

typedef struct {
    const cli_options *o;
    train_run tr, lora, qlora;
    infer_run ir;
    int nsides;
    side s[MAX_SIDES];
    const char *html[MAX_SIDES]; // each side's run for the page, once measured
    step_record rec[2];
} compare_cmd;

static const char *const lora_titles[MAX_SIDES] = {"full fine-tune", "LoRA", "QLoRA", "inference"};

// The next side's profiler: the skeleton started the first and stops the last.
static int next_profiler(compare_cmd *c, bool meta, ag_err *err) {
    mp_shutdown();
    if (cli_profiler_start(c->o, meta) == 0) return 0;
    ag_err_set(err, "cannot start the profiler");
    mp_options mo = {.meta = true};
    mp_init(&mo);
    return -1;
}

static int run_lora(compare_cmd *c, ag_err *err) {
    train_run *t[3] = {&c->tr, &c->lora, &c->qlora};
    double ymax = 0;
    for (int k = 0; k < 3; k++) {
        cli_progress("%s", lora_titles[k]);
        if (k && next_profiler(c, t[k]->meta, err) != 0) return -1;
        if (cli_train_run(t[k], err) != 0) return -1;
        if (k == 0) ymax = (double)mp_peak().total;
        read_side(&c->s[k], c->o, lora_titles[k], ymax);
        c->html[k] = c->s[k].html_len ? c->s[k].html : NULL;
    }
    if (next_profiler(c, c->o->meta, err) != 0) return -1;
    int rc = cli_infer_run(&c->ir, err);
    if (rc == 0) read_side(&c->s[3], c->o, lora_titles[3], ymax);
    c->html[3] = c->s[3].html_len ? c->s[3].html : NULL;
    return rc;
}

// Training first: its total peak sets the common scale of both charts. Each side has a
// profiler of its own; the skeleton started the first and stops the last.
static int run(void *arg, ag_err *err) {
    compare_cmd *c = arg;
    if (c->nsides == MAX_SIDES) return run_lora(c, err);
    cli_progress("training step");
    int rc = cli_train_run(&c->tr, err);
    double ymax = (double)mp_peak().total;
    if (rc != 0) return -1;
    read_side(&c->s[0], c->o, "training step", ymax);
    c->html[0] = c->s[0].html_len ? c->s[0].html : NULL;
    mp_shutdown();
    if (cli_profiler_start(c->o, c->o->meta) != 0) {
        ag_err_set(err, "cannot start the profiler");
        mp_options mo = {.meta = true};
        mp_init(&mo); // the skeleton shuts one down
        return -1;
    }
    rc = cli_infer_run(&c->ir, err);
    if (rc == 0) read_side(&c->s[1], c->o, "inference", ymax);
    c->html[1] = c->s[1].html_len ? c->s[1].html : NULL;
    return rc;
}

static uint64_t meta_peak(void *arg, ag_err *err) {
    const compare_cmd *c = arg;
    const train_run *sides[3] = {&c->tr, &c->lora, &c->qlora};
    step_record rec = {0};
    infer_run g = cli_infer_meta_copy(&c->ir);
    uint64_t peak = 0;
    mp_options mo = {.meta = true};
    // every training side: the full fine-tune, and with --lora the LoRA and QLoRA runs
    for (int k = 0; k < (c->nsides == MAX_SIDES ? 3 : 1); k++) {
        train_run t = *sides[k];
        t.meta = true;
        t.steps = &rec;
        if (mp_init(&mo) != MP_OK) return 0;
        uint64_t p = cli_train_run(&t, err) == 0 ? mp_peak().total : 0;
        mp_shutdown();
        if (!p) {
            cli_infer_meta_free(&g);
            return 0;
        }
        peak = p > peak ? p : peak;
    }
    if (peak && mp_init(&mo) == MP_OK) {
        if (cli_infer_run(&g, err) != 0)
            peak = 0;
        else if (mp_peak().total > peak)
            peak = mp_peak().total;
        mp_shutdown();
    }
    cli_infer_meta_free(&g);
    return peak;
}

// The two charts one above the other, on one vertical scale and one normalised horizontal axis
// (share of each run), in one picture of fixed aspect that scales to the page.
static int svg_pair(FILE *f, void *arg, ag_err *err) {
    (void)err;
    const compare_cmd *c = arg;
    const side *s = c->s;
    const int n = c->nsides;
    fprintf(
        f,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"100%%\" "
        "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
        CLI_SVG_W, n * CLI_SVG_H);
    for (int i = 0; i < n; i++) {
        // Each side's own <svg> element nested at its offset, its size set here.
        const char *body = strstr(s[i].svg ? s[i].svg : "", "viewBox=");
        if (!body) return -1;
        fprintf(f, "<svg x=\"0\" y=\"%d\" width=\"%d\" height=\"%d\" %s\n", i * CLI_SVG_H, CLI_SVG_W, CLI_SVG_H, body);
    }
    fprintf(f, "</svg>\n");
    return 0;
}

static void print_lora_table(FILE *f, const compare_cmd *c) {
    char a[4][40], t[256];
    fprintf(f,
            "membill compare --lora: %s; training: batch %ld x %ld tokens, %s; inference: batch %ld x %ld-token "
            "prompt + %ld new\n",
            c->tr.cfg.name, c->tr.batch, c->tr.seq_len, optim_kind_name(c->tr.ocfg.kind), c->ir.batch, c->ir.seq_len,
            c->ir.new_tokens);
    fprintf(f, "%s; QLoRA: the same adapters on a %s base\n", cli_lora_text(&c->lora.cfg, &c->lora.lora, t, sizeof t),
            c->qlora.lora.base_dtype);
    cli_lora_params_text(f, &c->lora.cfg, &c->lora.lora);
    const double inf = (double)c->s[3].total.total;
    fprintf(f, "answer: total peak over inference's: full %.2f x, LoRA %.2f x, QLoRA %.2f x\n",
            inf ? (double)c->s[0].total.total / inf : 0, inf ? (double)c->s[1].total.total / inf : 0,
            inf ? (double)c->s[2].total.total / inf : 0);
    fprintf(f, "\n  %-11s", "category");
    for (int k = 0; k < MAX_SIDES; k++) fprintf(f, " %-20s", lora_titles[k]);
    fputc('\n', f);
    for (int cat = 0; cat <= MP_NCATEGORIES; cat++) {
        fprintf(f, "  %-11s", cat < MP_NCATEGORIES ? mp_category_name(cat) : "total peak");
        for (int k = 0; k < MAX_SIDES; k++) {
            uint64_t v = cat < MP_NCATEGORIES ? c->s[k].peak[cat] : c->s[k].total.total;
            fprintf(f, " %-20s", cli_commas(a[k], sizeof a[k], v));
        }
        fputc('\n', f);
    }
    const train_run *t3[3] = {&c->tr, &c->lora, &c->qlora};
    fprintf(f, "  %-11s", "step time");
    for (int k = 0; k < 3; k++) {
        char st[32] = "-";
        if (!t3[k]->meta) snprintf(st, sizeof st, "%.3f s", t3[k]->steps[0].step_s);
        fprintf(f, " %-20s", st);
    }
    fprintf(f, " %-20s\n", "-");
}

static void print_table(FILE *f, const void *arg, bool failed) {
    const compare_cmd *c = arg;
    if (!failed && c->nsides == MAX_SIDES) {
        print_lora_table(f, c);
        return;
    }
    const train_run *tr = &c->tr;
    const infer_run *ir = &c->ir;
    const side *t = &c->s[0], *g = &c->s[1];
    if (failed) return; // a side that did not finish has no peak to compare
    char a[64], b[64];
    fprintf(f,
            "membill compare: %s; training: batch %ld x %ld tokens, %s; inference: batch %ld x %ld-token prompt + %ld "
            "new, %s\n",
            tr->cfg.name, tr->batch, tr->seq_len, optim_kind_name(tr->ocfg.kind), ir->batch, ir->seq_len,
            ir->new_tokens, ir->use_cache ? "KV cache" : "no cache");
    if (tr->ocfg.kind == OPTIM_ADAM || tr->ocfg.kind == OPTIM_ADAMW)
        fprintf(f, "adam: %s; ", optim_adam_impl_name(tr->ocfg.adam_impl));
    char fw[192];
    fprintf(f, "framework: %s; attention: %s\n", cli_framework_text(tr->framework, tr->cfg.family, fw, sizeof fw),
            cli_attention_text(tr->attention));
    cli_text_line(f, &ir->text);
    fprintf(f, "answer: training's peak %s is %.2f x inference's %s\n", cli_short_bytes(a, sizeof a, t->total.total),
            g->total.total ? (double)t->total.total / (double)g->total.total : 0,
            cli_short_bytes(b, sizeof b, g->total.total));
    fputc('\n', f);
    fprintf(f, "  %-11s %-36s %-36s\n", "category", "training step (peak)", "inference (peak)");
    for (int c = 0; c < MP_NCATEGORIES; c++)
        fprintf(f, "  %-11s %-36s %-36s\n", mp_category_name(c), mp_format_bytes(a, sizeof a, t->peak[c]),
                mp_format_bytes(b, sizeof b, g->peak[c]));
    fprintf(f, "  %-11s %-36s %-36s\n", "total peak", mp_format_bytes(a, sizeof a, t->total.total),
            mp_format_bytes(b, sizeof b, g->total.total));
}

static json_t *side_json(const side *s) {
    json_t *o = json_object(), *cats = json_object();
    for (int c = 0; c < MP_NCATEGORIES; c++)
        json_object_set_new(cats, mp_category_name(c), json_integer((json_int_t)s->peak[c]));
    json_object_set_new(o, "categories", cats);
    json_object_set_new(o, "total_peak_bytes", json_integer((json_int_t)s->total.total));
    json_object_set_new(o, "peak_phase", json_string(mp_phase_name(s->total.phase)));
    return o;
}

static json_t *compare_json(const void *arg, bool failed) {
    const compare_cmd *c = arg;
    json_t *root = cli_report_root(&c->tr.cfg);
    if (c->ir.text.ids) json_object_set_new(root, "prompt_ids", cli_prompt_ids_json(&c->ir.text, c->ir.batch));
    if (failed) return root;
    if (c->nsides == MAX_SIDES) {
        // "lora" is the adapters' setting, as train's and plan's reports have it
        static const char *const keys[MAX_SIDES] = {"full", "lora_train", "qlora_train", "infer"};
        const train_run *t3[3] = {&c->tr, &c->lora, &c->qlora};
        for (int k = 0; k < MAX_SIDES; k++) {
            json_t *sj = side_json(&c->s[k]);
            if (k < 3 && !t3[k]->meta) json_object_set_new(sj, "step_s", json_real(t3[k]->steps[0].step_s));
            json_object_set_new(root, keys[k], sj);
        }
        json_object_set_new(root, "lora", cli_lora_json(&c->lora.cfg, &c->lora.lora));
        return root;
    }
    json_object_set_new(root, "train", side_json(&c->s[0]));
    json_object_set_new(root, "infer", side_json(&c->s[1]));
    json_object_set_new(root, "ratio",
                        json_real(c->s[1].total.total ? (double)c->s[0].total.total / (double)c->s[1].total.total : 0));
    return root;
}

int cmd_compare(const cli_options *o) {
    compare_cmd c = {.o = o};
    ag_err err = {""};
    step_record rec = {0};
    int rc = cli_infer_prepare(o, &c.ir, &err);
    if (rc == 0) {
        c.tr.cfg = c.ir.cfg;
        memcpy(c.tr.st_path, c.ir.st_path, sizeof c.tr.st_path);
        optim_kind kind = OPTIM_ADAM;
        optim_parse_kind(o->optimizer, &kind);
        c.tr.ocfg = optim_defaults(kind);
        c.tr.ocfg.lr = (float)o->lr;
        optim_parse_adam_impl(o->adam_impl, &c.tr.ocfg.adam_impl);
        cli_parse_dtype("fp32", &c.tr.dtype);
        c.tr.ids = c.ir.ids;
        c.tr.batch = c.ir.batch;
        c.tr.seq_len = c.ir.seq_len;
        c.tr.steps = &rec;
        c.tr.nsteps = 1;
        c.tr.meta = o->meta;
        c.tr.seed = o->seed;
        c.tr.framework = c.ir.framework;
        c.tr.attention = c.ir.attention;
        c.nsides = 2;
        if (o->lora && (rc = cli_lora_from_options(o, &c.lora.lora, &err)) == 0) {
            c.nsides = MAX_SIDES;
            c.lora.cfg = c.tr.cfg; // the same run with adapters, then on a quantised base
            memcpy(c.lora.st_path, c.tr.st_path, sizeof c.lora.st_path);
            c.lora.ocfg = c.tr.ocfg;
            c.lora.dtype = c.tr.dtype;
            c.lora.ids = c.tr.ids;
            c.lora.batch = c.tr.batch, c.lora.seq_len = c.tr.seq_len;
            c.lora.nsteps = 1, c.lora.steps = &c.rec[0];
            c.lora.meta = o->meta, c.lora.seed = o->seed;
            c.lora.framework = c.tr.framework, c.lora.attention = c.tr.attention;
            c.qlora = c.lora;
            c.qlora.steps = &c.rec[1];
            if (!c.qlora.lora.base_dtype) c.qlora.lora.base_dtype = "nf4";
            c.lora.lora.base_dtype = NULL; // --base-dtype is the QLoRA column's
        }
        if (rc == 0 && c.tr.seq_len < 2) {
            ag_err_set(&err, "a training step needs at least 2 tokens, not %ld", c.tr.seq_len);
            rc = c.ir.text.ids ? EXIT_RUN_FAILED : EXIT_USAGE; // a prompt's count is the tokenizer's
        }
    }
    if (rc != 0) {
        fprintf(stderr, "membill compare: %s\n", err.msg);
        cli_infer_free(&c.ir);
        return rc;
    }
    cli_job job = {.arg = &c,
                   .run = run,
                   .meta_peak = meta_peak,
                   .text = print_table,
                   .json = compare_json,
                   .svg = svg_pair,
                   .svg_arg = &c,
                   .html_runs = c.html,
                   .html_nruns = c.nsides,
                   .title = "membill compare"};
    rc = cli_job_main(o, &job);
    free(c.s[0].svg);
    free(c.s[1].svg);
    free(c.s[0].html);
    free(c.s[1].html);
    cli_infer_free(&c.ir);
    return rc;
}
