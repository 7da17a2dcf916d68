/* mca.h: marks a kernel's inner loop for LLVM's machine-code analyser.
 *
 * NBI_MCA_BEGIN("name") at the top of a hot loop's body and NBI_MCA_END("name")
 * at its bottom put `# LLVM-MCA-BEGIN name` / `# LLVM-MCA-END name` comments
 * in the assembly when the file is compiled with -DNB_MCA (make mca does, to
 * .s files it never links); llvm-mca then reports the steady-state cycles of
 * one iteration of each named region on a CPU model. In every other build
 * the marks are nothing. The asm statements have no operands and no
 * clobbers, so they do not change what the compiler may keep in registers;
 * being volatile they keep their place relative to each other. */
#ifndef NABLA_OPS_ARCH_MCA_H
#define NABLA_OPS_ARCH_MCA_H

#ifdef NB_MCA
#define NBI_MCA_BEGIN(name) __asm__ volatile("# LLVM-MCA-BEGIN " name)
#define NBI_MCA_END(name) __asm__ volatile("# LLVM-MCA-END " name)
#else
#define NBI_MCA_BEGIN(name) ((void)0)
#define NBI_MCA_END(name) ((void)0)
#endif

#endif
