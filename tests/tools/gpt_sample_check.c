/* gpt_sample_check.c: examples/gpt with GPT-2's tokenizer, as a user runs it.
 *
 *   gpt_sample_check GPT TOKENIZER DIR
 *
 * writes DIR/vocab_llmc.bin (tests/gpt_files.h: GPT-2's vocabulary of 50257
 * on a 1-layer model of n_embd 64) and runs the example GPT on it:
 *   - --init FILE --tokenizer TOK --prompt TEXT --sample N samples without
 *     training (no step line, the file unchanged), prints the prompt and the
 *     sample as text, and the text is what nb_gpt_generate makes from the
 *     prompt's ids (which are those of OpenAI's tiktoken, js-tiktoken's gpt2
 *     encoding: "Hello, my name is" -> 15496 11 616 1438 318), decoded;
 *   - a text file is tokenized for fine-tuning (--steps), its token count
 *     that of nb_tokenizer_encode;
 *   - what cannot be right is refused with a message naming it: --init with
 *     nothing to do, text as bytes for a 50257-token model, a tokenizer
 *     larger than the model's vocabulary, --eval with --steps.
 * Prints one line per check; exit status 1 if any failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../nabla.h"
#include "../gpt_files.h"
#include "tool_check.h"

static uint64_t file_hash(const char *path) {
    FILE *f = fopen(path, "rb");
    uint64_t h = 1469598103934665603u;
    for (int c; f && (c = fgetc(f)) != EOF;) h = (h ^ (uint64_t)c) * 1099511628211u;
    if (f) fclose(f);
    return h;
}

/* What gpt --seed SEED --sample N --top-k K --prompt PROMPT prints after its
 * "sample (...):" line: the prompt and the generated tokens, decoded. */
static char *expected_sample(const char *model, nb_tokenizer *tok, const char *prompt,
                             int64_t seed, int64_t n, int64_t top_k, int64_t *ids, int64_t *nid) {
    nb_params *ps = nb_params_new();
    nb_GPT m;
    if (!ps || nb_gpt_from_file(&m, ps, model) != 0) return NULL;
    int64_t len = (int64_t)strlen(prompt), all[256];
    *nid = nb_tokenizer_encode(tok, prompt, len, ids, len);
    memcpy(all, ids, (size_t)*nid * sizeof *ids);
    nb_rng rng;
    nb_rng_seed(&rng, (uint64_t)seed + 3); /* the example's sampling stream */
    nb_gpt_sample_opts so = {.temperature = 0.8, .top_k = top_k};
    int64_t made = nb_gpt_generate(&m, ids, *nid, n, &so, &rng, all + *nid, NULL, NULL);
    char *text = NULL;
    if (made == n) {
        int64_t bytes = nb_tokenizer_decode(tok, all, *nid + n, NULL, 0);
        text = malloc((size_t)bytes + 1);
        nb_tokenizer_decode(tok, all, *nid + n, text, bytes);
        text[bytes] = 0;
    }
    nb_gpt_free(&m);
    nb_params_free(ps);
    return text;
}

int main(int argc, char **argv) {
    tool_name = "gpt-sample-check";
    if (argc != 4) {
        fprintf(stderr, "usage: %s GPT TOKENIZER DIR\n", argv[0]);
        return 2;
    }
    const char *gpt = argv[1], *tokp = argv[2], *dir = argv[3];
    char model[1024], cmd[8192];
    snprintf(model, sizeof model, "%s/vocab_llmc.bin", dir);
    if (gf_write_llmc(&GF_VOCAB, model) != 0) return fprintf(stderr, "cannot write %s\n", model), 1;
    nb_tokenizer *tok = nb_tokenizer_load(tokp);
    if (!tok) return fprintf(stderr, "gpt-sample-check: %s\n", nb_last_error()), 1;
    int st;
    char *out, detail[16384];

    /* 1. sampling text from the file, no training */
    const char *prompt = "Hello, my name is";
    uint64_t before = file_hash(model);
    snprintf(cmd, sizeof cmd, "%s --init %s --tokenizer %s --prompt '%s' --sample 24 --top-k 40 "
             "--seed 7 --threads 1", gpt, model, tokp, prompt);
    out = run(cmd, &st);
    int64_t ids[64], nid = 0;
    char *want = expected_sample(model, tok, prompt, 7, 24, 40, ids, &nid);
    const int64_t tiktoken[] = {15496, 11, 616, 1438, 318};
    check(nid == 5 && !memcmp(ids, tiktoken, sizeof tiktoken), "the prompt's ids are tiktoken's",
          "nb_tokenizer_encode gave other ids");
    const char *head = out ? strstr(out, "top-k 40):\n") : NULL;
    snprintf(detail, sizeof detail, "status %d, output:\n%s\nexpected the sample:\n%s", st,
             out ? out : "(none)", want ? want : "(none)");
    check(st == 0 && head && want && !strncmp(head + 11, want, strlen(want)) &&
              !strcmp(head + 11 + strlen(want), "\n"),
          "--init --tokenizer --prompt TEXT --sample 24 prints the prompt and nb_gpt_generate's "
          "tokens as text", detail);
    check(out && strstr(out, "no training (no --steps)") && !strstr(out, "\nstep "),
          "sampling trains nothing (no step line, says so)", detail);
    check(file_hash(model) == before, "the --init file is unchanged", model);

    /* --export converts: the Hugging Face file samples the same text */
    char hf[1100];
    snprintf(hf, sizeof hf, "%s/vocab_hf.safetensors", dir);
    snprintf(cmd, sizeof cmd, "%s --init %s --export %s", gpt, model, hf);
    char *conv = run(cmd, &st);
    snprintf(detail, sizeof detail, "status %d, output:\n%s", st, conv ? conv : "(none)");
    check(st == 0 && conv && strstr(conv, "Hugging Face's model.safetensors") &&
              !strstr(conv, "\nstep "),
          "--init llm.c --export x.safetensors converts without training", detail);
    free(conv);
    snprintf(cmd, sizeof cmd, "%s --init %s --tokenizer %s --prompt '%s' --sample 24 --top-k 40 "
             "--seed 7 --threads 1", gpt, hf, tokp, prompt);
    conv = run(cmd, &st);
    const char *head2 = conv ? strstr(conv, "top-k 40):\n") : NULL;
    check(st == 0 && head && head2 && !strcmp(head, head2),
          "the exported file samples the same text", conv ? conv : "(none)");
    free(conv);
    free(out);
    free(want);

    /* 2. fine-tuning on a text file: tokenized */
    const char *text = "examples/data/kjv.txt";
    snprintf(cmd, sizeof cmd, "%s --init %s --tokenizer %s --data %s --steps 2 --batch 2 --seq 16 "
             "--threads 1", gpt, model, tokp, text);
    out = run(cmd, &st);
    FILE *f = fopen(text, "rb");
    char *buf = malloc(1 << 20);
    int64_t len = f ? (int64_t)fread(buf, 1, 1 << 20, f) : 0, *all = malloc(sizeof *all << 20);
    if (f) fclose(f);
    char line[128];
    snprintf(line, sizeof line, "data %s: %lld tokens;", text,
             (long long)nb_tokenizer_encode(tok, buf, len, all, len));
    snprintf(detail, sizeof detail, "status %d, expected \"%s\" in:\n%s", st, line,
             out ? out : "(none)");
    check(st == 0 && out && strstr(out, line) && strstr(out, "\nstep 2: loss "),
          "--data TEXT --tokenizer: the text's GPT-2 tokens, trained on", detail);
    free(out);
    free(buf);
    free(all);

    /* 3. refusals, each before any step */
    char args[4][4096], msg[4][4096];
    snprintf(args[0], sizeof args[0], "--init %s", model);
    snprintf(msg[0], sizeof msg[0], "gpt: --init %s: nothing to do; --sample N samples", model);
    snprintf(args[1], sizeof args[1], "--init %s --data %s --steps 1", model, text);
    snprintf(msg[1], sizeof msg[1], "is not an llm.c token file: read as text, its bytes would "
             "be token ids 0-255 of a model whose vocabulary has 50257 tokens; give --tokenizer");
    snprintf(args[2], sizeof args[2], "--config tiny --tokenizer %s --sample 4", tokp);
    snprintf(msg[2], sizeof msg[2], "has 50257 tokens, more than the model's vocabulary of 256 "
             "(config tiny)");
    snprintf(args[3], sizeof args[3], "--init %s --eval --steps 3", model);
    snprintf(msg[3], sizeof msg[3], "--eval measures the loss of the model as it is");
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --threads 1", gpt, args[i]);
        out = run(cmd, &st);
        snprintf(detail, sizeof detail, "status %d, expected \"%s\" in:\n%s", st, msg[i],
                 out ? out : "(none)");
        char what[4200];
        snprintf(what, sizeof what, "refused: gpt %s", args[i]);
        check(st == 1 && out && strstr(out, msg[i]) && !strstr(out, "step 1:"), what, detail);
        free(out);
    }
    nb_tokenizer_free(tok);
    printf("gpt-sample-check: %s\n", fails ? "FAILED" : "all passed");
    return fails ? 1 : 0;
}
