/* Core-state probe (benchmarks/corestate.py): is this CPU core shared right now?
 *
 * On a VM, the physical core under a vCPU may be shared with a busy SMT sibling (another
 * guest or a host thread) that the guest cannot see: no steal time is reported, the
 * frequency stays the same, yet the core's rename/ALU bandwidth is halved for this
 * thread.  Two fixed register-only loops tell the states apart (no memory, no address
 * in play):
 *   corestate_adds(n)  n x 16 independent adds on 8 registers: bound by the core's issue
 *                      bandwidth (4-5 adds/cycle on an unshared Intel/AMD core, about
 *                      half that while a sibling competes);
 *   corestate_muls(n)  n x 8 dependent 64-bit multiplies: 3 cycles each on x86-64 cores,
 *                      so their rate gives the clock (unaffected by a sibling).
 * adds per cycle = adds rate / (3 x muls rate).  corestate_mxcsr() reads MXCSR (FTZ/DAZ
 * and the sticky exception flags) and corestate_clear_flags() clears those flags, for the
 * reproducer's diagnostics (did a denormal occur during the timed calls?).  x86-64 only. */
#include <stdint.h>

#define A(r) "add $1, %" #r "\n\t"

uint64_t corestate_adds(uint64_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0, e = 0, f = 0, g = 0, h = 0;
    for (uint64_t i = 0; i < n; i++)
        __asm__ volatile(A(0) A(1) A(2) A(3) A(4) A(5) A(6) A(7)
                         A(0) A(1) A(2) A(3) A(4) A(5) A(6) A(7)
                         : "+r"(a), "+r"(b), "+r"(c), "+r"(d), "+r"(e), "+r"(f), "+r"(g),
                           "+r"(h));
    return a + b + c + d + e + f + g + h;
}

uint64_t corestate_muls(uint64_t n) {
    uint64_t x = 1, k = 0x9E3779B97F4A7C15ULL;
    for (uint64_t i = 0; i < n; i++)
        __asm__ volatile("imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0\n\t"
                         "imul %1, %0\n\timul %1, %0\n\timul %1, %0\n\timul %1, %0"
                         : "+r"(x) : "r"(k));
    return x;
}

unsigned corestate_mxcsr(void) {
    unsigned v;
    __asm__ volatile("stmxcsr %0" : "=m"(v));
    return v;
}

void corestate_clear_flags(void) {
    unsigned v;
    __asm__ volatile("stmxcsr %0" : "=m"(v));
    v &= ~0x3fu;
    __asm__ volatile("ldmxcsr %0" : : "m"(v));
}
