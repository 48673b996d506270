/* threads: two threads, two contexts, the same library, at the same time.
 *
 * Each context owns its workspace and params: thread B's context gets a
 * different b2 (set_param) than the baked one thread A uses.  The references
 * are computed first on one thread; then both threads run ITERS times
 * concurrently and every result must equal its own reference.  Exit 0 when
 * all match.
 */
#define _POSIX_C_SOURCE 200112L
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "mlp.h"

#define ITERS 2000

typedef struct {
    mlp_ctx *ctx;
    float x[MLP_INPUT0_NUMEL];
    float ref0[MLP_OUTPUT0_NUMEL], ref1[MLP_OUTPUT1_NUMEL];
    int mismatches, failures;
} job;

static int run(job *j, float *o0, float *o1)
{
    const float *in[1];
    float *out[2];
    in[0] = j->x;
    out[0] = o0;
    out[1] = o1;
    return mlp_run(j->ctx, in, out);
}

static int same(const float *a, const float *b, size_t n)
{
    size_t i;
    for (i = 0; i < n; ++i)
        if (fabsf(a[i] - b[i]) > 1e-6f * (1.0f + fabsf(b[i])))
            return 0;
    return 1;
}

static void *worker(void *arg)
{
    job *j = (job *)arg;
    float o0[MLP_OUTPUT0_NUMEL], o1[MLP_OUTPUT1_NUMEL];
    int it;
    for (it = 0; it < ITERS; ++it) {
        if (run(j, o0, o1) != RLX_OK) {
            j->failures++;
            continue;
        }
        if (!same(o0, j->ref0, MLP_OUTPUT0_NUMEL) || !same(o1, j->ref1, MLP_OUTPUT1_NUMEL))
            j->mismatches++;
    }
    return NULL;
}

int main(void)
{
    static job jobs[2];
    float b2[MLP_PARAM3_NUMEL];
    pthread_t th[2];
    size_t i;
    int k, bad = 0;

    if (mlp_check_abi() != RLX_OK) {
        fprintf(stderr, "threads: mlp.h does not match libmlp.so\n");
        return 1;
    }
    for (k = 0; k < 2; ++k) {
        jobs[k].ctx = mlp_create();
        if (jobs[k].ctx == NULL) {
            fprintf(stderr, "threads: %s\n", mlp_last_error(NULL));
            return 1;
        }
        for (i = 0; i < MLP_INPUT0_NUMEL; ++i)
            jobs[k].x[i] = (float)((int)((i + 5 * k) % 11) - 5) * 0.125f;
    }
    for (i = 0; i < MLP_PARAM3_NUMEL; ++i)
        b2[i] = 1.5f * (float)i;
    if (mlp_set_param(jobs[1].ctx, "b2", b2, MLP_PARAM3_NUMEL) != RLX_OK) {
        fprintf(stderr, "threads: %s\n", mlp_last_error(jobs[1].ctx));
        return 1;
    }
    for (k = 0; k < 2; ++k)
        if (run(&jobs[k], jobs[k].ref0, jobs[k].ref1) != RLX_OK) {
            fprintf(stderr, "threads: %s\n", mlp_last_error(jobs[k].ctx));
            return 1;
        }
    if (same(jobs[0].ref0, jobs[1].ref0, MLP_OUTPUT0_NUMEL)) {
        fprintf(stderr, "threads: the two contexts should differ (own params)\n");
        return 1;
    }
    for (k = 0; k < 2; ++k)
        if (pthread_create(&th[k], NULL, worker, &jobs[k]) != 0) {
            fprintf(stderr, "threads: pthread_create failed\n");
            return 1;
        }
    for (k = 0; k < 2; ++k)
        pthread_join(th[k], NULL);
    for (k = 0; k < 2; ++k) {
        printf("thread %d: %d runs, %d failures, %d mismatches\n", k, ITERS,
               jobs[k].failures, jobs[k].mismatches);
        bad |= jobs[k].failures || jobs[k].mismatches;
        mlp_destroy(jobs[k].ctx);
    }
    printf(bad ? "threads: FAILED\n" : "threads: OK\n");
    return bad;
}
