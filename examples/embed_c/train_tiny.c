/* train_tiny: train a linear regression from C with tiny_train_step.
 *
 * The library was compiled with `rlxc compile model.py:tiny --train
 * --optimizer adamw --lr 0.05`: tiny_train_step(ctx, inputs, lr, &loss) runs
 * forward, backward and one AdamW update on the params held in the context.
 * The data is y = x . w_true + b_true for a fixed x; the program prints the
 * loss as it goes down, then the learned params (tiny_get_param), and exits 1
 * if the final loss is not below a tenth of the first one.
 */
#include <stdio.h>

#include "tiny.h"

#define STEPS 300

int main(void)
{
    static const float w_true[4] = {1.0f, -2.0f, 0.5f, 3.0f};
    static const float b_true = 0.25f;
    static float x[TINY_INPUT0_NUMEL];
    static float y[TINY_INPUT1_NUMEL];
    const float *inputs[TINY_NUM_INPUTS];
    float w[TINY_PARAM0_NUMEL], b[TINY_PARAM1_NUMEL];
    float loss = 0.0f, first = 0.0f;
    tiny_ctx *ctx;
    int i, k, step, rc;

    if (tiny_check_abi() != RLX_OK) {
        fprintf(stderr, "train_tiny: tiny.h does not match libtiny.so\n");
        return 1;
    }
    for (i = 0; i < 32; ++i) {
        y[i] = b_true;
        for (k = 0; k < 4; ++k) {
            x[i * 4 + k] = (float)((i * 4 + k) * 37 % 17 - 8) / 8.0f;
            y[i] += x[i * 4 + k] * w_true[k];
        }
    }
    inputs[0] = x;
    inputs[1] = y;

    ctx = tiny_create();
    if (ctx == NULL) {
        fprintf(stderr, "train_tiny: %s\n", tiny_last_error(NULL));
        return 1;
    }
    for (step = 0; step < STEPS; ++step) {
        rc = tiny_train_step(ctx, inputs, 0.05f, &loss);
        if (rc != RLX_OK) {
            fprintf(stderr, "train_tiny: step %d failed (%d): %s\n", step, rc,
                    tiny_last_error(ctx));
            tiny_destroy(ctx);
            return 1;
        }
        if (step == 0)
            first = loss;
        if (step % 30 == 0 || step == STEPS - 1)
            printf("step %3d loss %.6g\n", step, (double)loss);
    }
    if (tiny_get_param(ctx, "w", w, TINY_PARAM0_NUMEL) != RLX_OK ||
        tiny_get_param(ctx, "b", b, TINY_PARAM1_NUMEL) != RLX_OK) {
        fprintf(stderr, "train_tiny: %s\n", tiny_last_error(ctx));
        tiny_destroy(ctx);
        return 1;
    }
    printf("w = [%.4f, %.4f, %.4f, %.4f]  b = %.4f  (true: [1, -2, 0.5, 3], 0.25)\n",
           (double)w[0], (double)w[1], (double)w[2], (double)w[3], (double)b[0]);
    tiny_destroy(ctx);
    if (!(loss < 0.1f * first)) {
        printf("loss did not go down: %.6g -> %.6g\n", (double)first, (double)loss);
        return 1;
    }
    printf("loss went down: %.6g -> %.6g\n", (double)first, (double)loss);
    return 0;
}
