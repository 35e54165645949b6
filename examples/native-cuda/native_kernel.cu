// native_kernel.cu: native_kernel.cuh alone, for the Rust example's PTX:
//   nvcc -ptx -arch=compute_80 -I crates/mesh-shm/include -o examples/native-rust/native_kernel.ptx examples/native-cuda/native_kernel.cu
#include "native_kernel.cuh"
