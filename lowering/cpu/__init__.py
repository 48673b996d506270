"""The native CPU backend: fusion, buffer plan, loop IR, LLVM codegen, sgemm, driver."""
