/* isacap: make this process's threads see an AVX2 CPU (no AVX-512, AMX, AVX-VNNI)
 * when they execute `cpuid`, so that every library that picks its kernels from cpuid
 * (OpenBLAS, MKL, oneDNN, YNNPACK/XNNPACK via cpuinfo, LLVM in XLA, NumPy) picks its
 * AVX2 ones.  Used by benchmarks/compare.py --peer-isa avx2 (through isacap.py).
 *
 * How: Linux CPUID faulting (x86 `cpuid_fault`, arch_prctl(ARCH_SET_CPUID, 0)) turns
 * every `cpuid` of the calling thread into a #GP, delivered as SIGSEGV (si_code
 * SI_KERNEL) at the instruction.  The SIGSEGV handler checks that the instruction is
 * cpuid (0F A2), turns faulting off for this thread for one real cpuid (a syscall: the
 * handler may not execute cpuid while faulting is on, and asking the CPU again keeps
 * per-core answers such as the APIC id exact), turns it back on, clears the masked bits
 * (MASKS below), writes EAX..EDX into the interrupted context and steps RIP past the
 * two bytes.  The setting is per thread, copied to threads created later (clone) and
 * dropped by execve: enable it before any thread starts; child processes are not capped.
 *
 * Leaf 0xD (XSAVE state sizes) is left as the CPU reports it: XCR0 (xgetbv, which cannot
 * be trapped) still enables the opmask/ZMM state, so XSAVE with a full mask still writes
 * it, and a buffer sized from a shrunk leaf 0xD would overflow.  Libraries decide on
 * AVX-512 from leaf 7 (and XCR0 only as "does the OS save it"), so leaf 7 is enough.
 *
 * Any other SIGSEGV goes to the handler that was installed before (or the default
 * action): the previous disposition is put back and the fault re-executed (a signal
 * sent by kill/raise is re-sent), so a real crash still crashes, exactly as without us;
 * if that handler puts ours back and re-raises, the default action follows.
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef ARCH_GET_CPUID
#define ARCH_GET_CPUID 0x1011
#define ARCH_SET_CPUID 0x1012
#endif

/* (leaf, subleaf, register 0..3 = eax ebx ecx edx, bits to clear) */
static const struct { uint32_t leaf, sub, reg, clear; } MASKS[] = {
    /* leaf 7.0 EBX: AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31 */
    {7, 0, 1, (1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) |
              (1u << 28) | (1u << 30) | (1u << 31)},
    /* leaf 7.0 ECX: VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14 (GFNI, VAES and
     * VPCLMULQDQ stay: they have VEX forms that AVX2 CPUs such as Zen 3 run) */
    {7, 0, 2, (1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14)},
    /* leaf 7.0 EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, AMX-BF16 22, FP16 23,
     * AMX-TILE 24, AMX-INT8 25 */
    {7, 0, 3, (1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) |
              (1u << 25)},
    /* leaf 7.1 EAX: AVX-VNNI 4, AVX512_BF16 5, AMX-FP16 21, AVX-IFMA 23 (the VEX
     * VNNI/IFMA are past AVX2 as oneDNN counts it: its avx2_vnni level) */
    {7, 1, 0, (1u << 4) | (1u << 5) | (1u << 21) | (1u << 23)},
    /* leaf 7.1 EDX: AVX-VNNI-INT8 4, AVX-NE-CONVERT 5, AMX-COMPLEX 8, AVX-VNNI-INT16 10,
     * AVX10 19 */
    {7, 1, 3, (1u << 4) | (1u << 5) | (1u << 8) | (1u << 10) | (1u << 19)},
};

static struct sigaction prev_action;   /* what was installed before us */
static volatile int installed;
static volatile long emulated;          /* cpuid instructions answered (all threads) */

static long set_faulting(int on) {
    return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on ? 0 : 1);
}

static void masked_cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    for (size_t i = 0; i < sizeof MASKS / sizeof MASKS[0]; i++)
        if (MASKS[i].leaf == leaf && MASKS[i].sub == sub)
            r[MASKS[i].reg] &= ~MASKS[i].clear;
}

static void handler(int sig, siginfo_t *si, void *vctx) {
    ucontext_t *uc = (ucontext_t *)vctx;
    greg_t *g = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)g[REG_RIP];
    if (si->si_code == SI_KERNEL && ip && ip[0] == 0x0f && ip[1] == 0xa2) {
        int saved = errno;
        uint32_t r[4];
        set_faulting(0);
        masked_cpuid((uint32_t)g[REG_RAX], (uint32_t)g[REG_RCX], r);
        set_faulting(1);
        g[REG_RAX] = r[0];    /* cpuid zero-extends its 32-bit results */
        g[REG_RBX] = r[1];
        g[REG_RCX] = r[2];
        g[REG_RDX] = r[3];
        g[REG_RIP] += 2;
        __atomic_add_fetch(&emulated, 1, __ATOMIC_RELAXED);
        errno = saved;
        return;
    }
    /* Not ours: hand the signal to the previous disposition the way the kernel would.
     * If we run again after that (installed == 0: the previous handler put us back, as
     * Python's faulthandler does before it re-raises), the default action ends it, so
     * that a handler which returns cannot make the fault loop. */
    if (installed) {
        sigaction(sig, &prev_action, NULL);
    } else {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(sig, &dfl, NULL);
    }
    installed = 0;
    if (si->si_code <= 0)      /* kill/raise/sigqueue: send it again (pending until we
                                  return, since SIGSEGV is blocked in this handler) */
        syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), sig);
    /* a fault re-executes the instruction on return and faults into prev_action */
}

/* Install the handler (chaining to whatever is there now) unless it is installed. */
static int install(void) {
    struct sigaction cur, sa;
    if (sigaction(SIGSEGV, NULL, &cur) != 0)
        return -errno;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == handler)
        return 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigfillset(&sa.sa_mask);   /* nothing runs between the two faulting toggles */
    prev_action = cur;
    if (sigaction(SIGSEGV, &sa, NULL) != 0)
        return -errno;
    installed = 1;
    return 1;
}

/* Public API (ctypes).  0 / 1 on success, -errno on failure. */

/* Install the handler, then turn CPUID faulting on for the calling thread (and the
 * threads it creates from now on).  -EINVAL/-ENODEV: no CPUID faulting on this CPU. */
int isacap_enable(void) {
    int rc = install();
    if (rc < 0)
        return rc;
    if (set_faulting(1) != 0)
        return -errno;
    return 0;
}

/* Put the handler back if someone replaced it (their handler becomes the one we chain
 * to).  1: it had been replaced, 0: it was in place. */
int isacap_reinstall(void) { return install(); }

/* 1 when our handler is the installed SIGSEGV handler. */
int isacap_handler_installed(void) {
    struct sigaction cur;
    if (sigaction(SIGSEGV, NULL, &cur) != 0)
        return -errno;
    return (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == handler;
}

/* 1 when CPUID faults on the calling thread, 0 when not, -errno when unsupported. */
int isacap_faulting(void) {
    long r = syscall(SYS_arch_prctl, ARCH_GET_CPUID, 0);
    return r < 0 ? -errno : (r == 0);
}

long isacap_emulated(void) { return emulated; }

/* Execute cpuid here (trapped when faulting is on): what a library sees. */
void isacap_cpuid(uint32_t leaf, uint32_t sub, uint32_t out[4]) {
    __cpuid_count(leaf, sub, out[0], out[1], out[2], out[3]);
}
