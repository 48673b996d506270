/* run_dyn: ONE compiled library (libmlpd.so, a dynamic batch "B") run at batch 1, 7
 * and 64, without recompiling.
 *
 * Per batch size: mlpd_set_dims(ctx, {B}) fixes the sizes of the next calls; the
 * buffers are sized with mlpd_input_numel / mlpd_output_numel (ctx, i) and
 * allocated by the caller; mlpd_run runs.  The input is deterministic (element i
 * of a B-row batch is ((i % 7) - 3) * 0.25) so a test can compare the printed
 * outputs with Func.run in Python.  A bad size is an error code with a message
 * naming the dimension, never a crash.
 */
#include <stdio.h>
#include <stdlib.h>

#include "mlpd.h"

static void print_shape(const char *kind, int i, const char *name, int rank,
                        const int64_t *dims)
{
    int d;
    printf("%s %d %s [", kind, i, name);
    for (d = 0; d < rank; ++d)
        printf("%s%lld", d ? ", " : "", (long long)dims[d]);
    printf("]\n");
}

static int run_batch(mlpd_ctx *ctx, int64_t batch)
{
    const float *inputs[MLPD_NUM_INPUTS];
    float *outputs[MLPD_NUM_OUTPUTS];
    float *x;
    int64_t i, n;
    int k, rc;

    if ((rc = mlpd_set_dims(ctx, &batch)) != RLX_OK) {
        fprintf(stderr, "run_dyn: set_dims(%lld): %s\n", (long long)batch,
                mlpd_last_error(ctx));
        return rc;
    }
    printf("batch %s=%lld\n", MLPD_DIM_NAMES[0], (long long)batch);
    n = mlpd_input_numel(ctx, 0);
    x = malloc((size_t)n * sizeof *x);
    for (i = 0; i < n; ++i)
        x[i] = (float)((int)(i % 7) - 3) * 0.25f;
    inputs[0] = x;
    for (k = 0; k < MLPD_NUM_OUTPUTS; ++k)
        outputs[k] = malloc((size_t)mlpd_output_numel(ctx, k) * sizeof(float));
    rc = mlpd_run(ctx, inputs, outputs);
    if (rc != RLX_OK)
        fprintf(stderr, "run_dyn: mlpd_run failed (%d): %s\n", rc, mlpd_last_error(ctx));
    for (k = 0; k < MLPD_NUM_OUTPUTS && rc == RLX_OK; ++k) {
        print_shape("output", k, mlpd_output_name(k), mlpd_output_rank(k),
                    mlpd_output_shape(ctx, k));
        for (i = 0; i < mlpd_output_numel(ctx, k); ++i)
            printf("%s%.9g", i ? " " : "", (double)outputs[k][i]);
        printf("\n");
    }
    for (k = 0; k < MLPD_NUM_OUTPUTS; ++k)
        free(outputs[k]);
    free(x);
    return rc;
}

int main(void)
{
    static const int64_t batches[] = {1, 7, 64};
    int64_t bad[] = {0, -3, (int64_t)1 << 62};
    mlpd_ctx *ctx;
    int b, rc;

    if (mlpd_check_abi() != RLX_OK) {
        fprintf(stderr, "run_dyn: mlpd.h does not match libmlpd.so\n");
        return 1;
    }
    ctx = mlpd_create();
    if (ctx == NULL) {
        fprintf(stderr, "run_dyn: %s\n", mlpd_last_error(NULL));
        return 1;
    }
    printf("dims %d: %s\n", MLPD_NUM_DIMS, mlpd_dim_name(0));
    for (b = 0; b < 3; ++b)
        if (run_batch(ctx, batches[b]) != RLX_OK) {
            mlpd_destroy(ctx);
            return 1;
        }
    /* errors are reported, not crashes; the last good sizes stay current: */
    for (b = 0; b < 3; ++b) {
        rc = mlpd_set_dims(ctx, &bad[b]);
        printf("set_dims(%lld) -> %d: %s\n", (long long)bad[b], rc, mlpd_last_error(ctx));
    }
    printf("current %s=%lld rows\n", MLPD_DIM_NAMES[0],
           (long long)mlpd_input_shape(ctx, 0)[0]);
    mlpd_destroy(ctx);
    return 0;
}
