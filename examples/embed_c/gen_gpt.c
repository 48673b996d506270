/* gen_gpt: generate text from C with the character-level GPT trained by
 * examples/train_gpt.py and exported by `rlxc compile` (params baked in).
 *
 *     gen_gpt VOCAB_FILE N "PROMPT"
 *
 * VOCAB_FILE holds the model's characters in id order (train_gpt.py writes
 * vocab.txt); PROMPT gives at least GPT_INPUT0_NUMEL (the context) characters,
 * of which the last context-many start the window.  Each step runs the model
 * on the window (ids as i32), takes the most likely next character (greedy, so
 * the output equals train_gpt.generate in Python) and slides the window by one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"

int main(int argc, char **argv)
{
    static char vocab[256];
    static int ids[GPT_INPUT0_NUMEL];
    static float probs[GPT_OUTPUT0_NUMEL];
    const float *inputs[GPT_NUM_INPUTS];
    float *outputs[GPT_NUM_OUTPUTS];
    size_t nvocab, plen, i;
    long n, step;
    const int ctxlen = (int)GPT_INPUT0_NUMEL;
    FILE *fh;
    gpt_ctx *ctx;

    if (argc != 4) {
        fprintf(stderr, "usage: %s VOCAB_FILE N PROMPT\n", argv[0]);
        return 2;
    }
    if (gpt_check_abi() != RLX_OK) {
        fprintf(stderr, "gen_gpt: gpt.h does not match libgpt.so\n");
        return 1;
    }
    fh = fopen(argv[1], "rb");
    if (fh == NULL) {
        fprintf(stderr, "gen_gpt: cannot open %s\n", argv[1]);
        return 1;
    }
    nvocab = fread(vocab, 1, sizeof vocab, fh);
    fclose(fh);
    if (nvocab != (size_t)GPT_OUTPUT0_NUMEL) {
        fprintf(stderr, "gen_gpt: %s has %zu characters, the model %d\n", argv[1], nvocab,
                (int)GPT_OUTPUT0_NUMEL);
        return 1;
    }
    n = strtol(argv[2], NULL, 10);
    plen = strlen(argv[3]);
    if (plen < (size_t)ctxlen) {
        fprintf(stderr, "gen_gpt: the prompt needs at least %d characters\n", ctxlen);
        return 1;
    }
    for (i = 0; i < (size_t)ctxlen; ++i) {
        const char *hit = memchr(vocab, argv[3][plen - ctxlen + i], nvocab);
        if (hit == NULL) {
            fprintf(stderr, "gen_gpt: prompt character %zu is not in the vocabulary\n", i);
            return 1;
        }
        ids[i] = (int)(hit - vocab);
    }
    ctx = gpt_create();
    if (ctx == NULL) {
        fprintf(stderr, "gen_gpt: %s\n", gpt_last_error(NULL));
        return 1;
    }
    inputs[0] = (const float *)ids;     /* i32 input: the buffer's bytes are read as i32 */
    outputs[0] = probs;
    for (step = 0; step < n; ++step) {
        size_t best = 0, j;
        if (gpt_run(ctx, inputs, outputs) != RLX_OK) {
            fprintf(stderr, "gen_gpt: %s\n", gpt_last_error(ctx));
            gpt_destroy(ctx);
            return 1;
        }
        for (j = 1; j < nvocab; ++j)
            if (probs[j] > probs[best])
                best = j;
        putchar(vocab[best]);
        memmove(ids, ids + 1, (size_t)(ctxlen - 1) * sizeof ids[0]);
        ids[ctxlen - 1] = (int)best;
    }
    putchar('\n');
    gpt_destroy(ctx);
    return 0;
}
