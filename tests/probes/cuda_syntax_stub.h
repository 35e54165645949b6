// cuda_syntax_stub.h: minimal stand-ins for CUDA's built-ins, so that g++ can parse a mesh.cuh program
// on a machine without nvcc: `bash tests/probes/cuda-syntax-check.sh FILE.cu...`. A SYNTAX AND TYPE
// CHECK ONLY: the stand-ins do nothing, inline PTX is not assembled (g++ -fsyntax-only does not look
// at asm constraints), and nothing about the GPU's behaviour is checked. nvcc is the real test.
#pragma once
#include <stdint.h>
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
struct dim3 { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };
static dim3 threadIdx, blockIdx, blockDim, gridDim;
inline void __syncthreads() {}
inline void __syncwarp(unsigned = 0xffffffffu) {}
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}
inline unsigned __activemask() { return ~0u; }
inline bool __all_sync(unsigned, bool p) { return p; }
inline bool __any_sync(unsigned, bool p) { return p; }
inline unsigned __ballot_sync(unsigned, bool p) { return p; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
template <class T> inline unsigned __match_any_sync(unsigned, T) { return 1u; }
template <class T> inline T __shfl_sync(unsigned, T v, int, int = 32) { return v; }
template <class T> inline T __ldcg(const T* p) { return *p; }
template <class T> inline T __shfl_xor_sync(unsigned, T v, int, int = 32) { return v; }
template <class T> inline T __shfl_up_sync(unsigned, T v, unsigned, int = 32) { return v; }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
template <class T> inline T atomicCAS(T* p, T c, T v) { T o = *p; if (o == c) *p = v; return o; }
template <class T> inline T atomicExch(T* p, T v) { T o = *p; *p = v; return o; }
template <class T> inline T atomicAdd(T* p, T v) { T o = *p; *p += v; return o; }
template <class T> inline T atomicMax(T* p, T v) { T o = *p; if (v > o) *p = v; return o; }
