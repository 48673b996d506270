/* train_mpi: data-parallel training from C with MPI (mpicc; mpiexec -n N).
 *
 * The library was compiled with `rlxc compile model.py:ddp --train --optimizer
 * adam --lr 0.01`; besides ddp_train_step it exports the two halves of a step:
 *   ddp_train_grads(ctx, inputs, scale, &loss, grads)   loss and flat gradients
 *   ddp_train_apply(ctx, grads, lr)                      the update from them
 * Each rank computes the gradients of its own 32 rows of the global batch with
 * scale = 1/size, the ranks sum [grads | loss] with ONE in-place MPI_Allreduce,
 * and every rank applies the same update: the result is one process training
 * on the whole batch (32 * size rows).  Params start from rank 0's (MPI_Bcast).
 *
 * Usage: mpiexec -n 2 ./train_mpi [STEPS [OUT.bin]]   (defaults: 10 steps)
 * Rank 0 prints the global loss per step; with OUT.bin it writes the final
 * params (float32, param order, each flattened).  Exits 1 if the params differ
 * between ranks after any step.  Data: model.py ddp_data (exact in float32).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"

#define ROWS 32 /* DDP_BATCH of model.py: the compiled per-rank batch */
#define NX 12
#define NY 4

static void make_data(int step, int row0, float *x, float *y)
{
    int r, k;
    for (r = 0; r < ROWS; ++r) {
        long g = row0 + r;
        for (k = 0; k < NX; ++k)
            x[r * NX + k] = (float)(((g * NX + k) * 31 + step * 17) % 23 - 11) / 11.0f;
        for (k = 0; k < NY; ++k)
            y[r * NY + k] = (float)(((g * NY + k) * 13 + step * 7) % 19 - 9) / 9.0f;
    }
}

/* the params as one flat buffer (param order), read from or written to ctx */
static int params_io(ddp_ctx *ctx, float *flat, int write)
{
    size_t off = 0;
    int i, rc;
    for (i = 0; i < ddp_num_params(); ++i) {
        size_t n = ddp_param_numel(i);
        rc = write ? ddp_set_param(ctx, ddp_param_name(i), flat + off, n)
                   : ddp_get_param(ctx, ddp_param_name(i), flat + off, n);
        if (rc != RLX_OK)
            return rc;
        off += n;
    }
    return RLX_OK;
}

static int fail(ddp_ctx *ctx, const char *what, int rc)
{
    fprintf(stderr, "train_mpi: %s failed (%d): %s\n", what, rc, ddp_last_error(ctx));
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
}

int main(int argc, char **argv)
{
    static float x[ROWS * NX], y[ROWS * NY];
    static float buf[DDP_NUM_GRADS + 1]; /* [grads | loss]: one Allreduce */
    static float mine[DDP_NUM_GRADS], root[DDP_NUM_GRADS];
    const float *inputs[DDP_NUM_INPUTS];
    int rank, size, step, steps, rc, differ;
    ddp_ctx *ctx;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    steps = argc > 1 ? atoi(argv[1]) : 10;
    if (ddp_check_abi() != RLX_OK) {
        fprintf(stderr, "train_mpi: ddp.h does not match libddp.so\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    ctx = ddp_create();
    if (ctx == NULL)
        return fail(NULL, "ddp_create", RLX_ERR_NOMEM);
    /* the params (a flat buffer of NUM_GRADS floats: every param is trained) */
    if ((rc = params_io(ctx, root, 0)) != RLX_OK)
        return fail(ctx, "get_param", rc);
    MPI_Bcast(root, DDP_NUM_GRADS, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if ((rc = params_io(ctx, root, 1)) != RLX_OK)
        return fail(ctx, "set_param", rc);
    inputs[0] = x;
    inputs[1] = y;
    for (step = 0; step < steps; ++step) {
        make_data(step, rank * ROWS, x, y);
        rc = ddp_train_grads(ctx, inputs, 1.0f / (float)size, &buf[DDP_NUM_GRADS], buf);
        if (rc != RLX_OK)
            return fail(ctx, "train_grads", rc);
        MPI_Allreduce(MPI_IN_PLACE, buf, DDP_NUM_GRADS + 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if ((rc = ddp_train_apply(ctx, buf, 0.01f)) != RLX_OK)
            return fail(ctx, "train_apply", rc);
        if (rank == 0)
            printf("step %2d loss %.6f\n", step, (double)buf[DDP_NUM_GRADS]);
        /* every rank must hold rank 0's params, bit for bit */
        if ((rc = params_io(ctx, mine, 0)) != RLX_OK)
            return fail(ctx, "get_param", rc);
        memcpy(root, mine, sizeof mine);
        MPI_Bcast(root, DDP_NUM_GRADS, MPI_FLOAT, 0, MPI_COMM_WORLD);
        differ = memcmp(root, mine, sizeof mine) != 0;
        MPI_Allreduce(MPI_IN_PLACE, &differ, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (differ) {
            if (rank == 0)
                fprintf(stderr, "train_mpi: params differ across ranks after step %d\n", step);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    if (rank == 0 && argc > 2) {
        FILE *f = fopen(argv[2], "wb");
        if (f == NULL || fwrite(mine, sizeof(float), DDP_NUM_GRADS, f) != DDP_NUM_GRADS) {
            fprintf(stderr, "train_mpi: cannot write %s\n", argv[2]);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        fclose(f);
    }
    ddp_destroy(ctx);
    MPI_Finalize();
    return 0;
}
