/* run_mlp: link the compiled model libmlp.so, run it once, print its outputs.
 *
 * Shows the whole C ABI of a forward-only artifact: the ABI check, a context,
 * the metadata functions (names, ranks, dims), one run, error reporting, and
 * cleanup.  The params were baked into the library by `rlxc compile`, so no
 * set_param call is needed.  The input is deterministic (element i is
 * ((i % 7) - 3) * 0.25) so a test can compare the printed outputs with
 * Func.run in Python.
 */
#include <stdio.h>

#include "mlp.h"

static void print_tensor(const char *kind, int i, const char *name, int rank,
                         const int64_t *dims)
{
    int d;
    printf("%s %d %s [", kind, i, name);
    for (d = 0; d < rank; ++d)
        printf("%s%lld", d ? ", " : "", (long long)dims[d]);
    printf("]\n");
}

int main(void)
{
    static float x[MLP_INPUT0_NUMEL];
    static float logits[MLP_OUTPUT0_NUMEL];
    static float probs[MLP_OUTPUT1_NUMEL];
    const float *inputs[MLP_NUM_INPUTS];
    float *outputs[MLP_NUM_OUTPUTS];
    float *bufs[MLP_NUM_OUTPUTS];
    mlp_ctx *ctx;
    size_t i;
    int k, rc;

    if (mlp_check_abi() != RLX_OK) {
        fprintf(stderr, "run_mlp: mlp.h does not match libmlp.so (ABI %u)\n",
                (unsigned)mlp_abi_version());
        return 1;
    }
    for (k = 0; k < mlp_num_inputs(); ++k)
        print_tensor("input", k, mlp_input_name(k), mlp_input_rank(k), mlp_input_shape(k));
    for (k = 0; k < mlp_num_params(); ++k)
        print_tensor("param", k, mlp_param_name(k), mlp_param_rank(k), mlp_param_shape(k));

    for (i = 0; i < MLP_INPUT0_NUMEL; ++i)
        x[i] = (float)((int)(i % 7) - 3) * 0.25f;
    inputs[0] = x;
    outputs[0] = bufs[0] = logits;
    outputs[1] = bufs[1] = probs;

    ctx = mlp_create();
    if (ctx == NULL) {
        fprintf(stderr, "run_mlp: %s\n", mlp_last_error(NULL));
        return 1;
    }
    rc = mlp_run(ctx, inputs, outputs);
    if (rc != RLX_OK) {
        fprintf(stderr, "run_mlp: mlp_run failed (%d): %s\n", rc, mlp_last_error(ctx));
        mlp_destroy(ctx);
        return 1;
    }
    for (k = 0; k < mlp_num_outputs(); ++k) {
        print_tensor("output", k, mlp_output_name(k), mlp_output_rank(k), mlp_output_shape(k));
        for (i = 0; i < mlp_output_numel(k); ++i)
            printf("%s%.9g", i ? " " : "", (double)bufs[k][i]);
        printf("\n");
    }
    /* errors are reported, not crashes: */
    rc = mlp_set_param(ctx, "no_such_param", x, 1);
    printf("set_param(\"no_such_param\") -> %d: %s\n", rc, mlp_last_error(ctx));
    mlp_destroy(ctx);
    return 0;
}
