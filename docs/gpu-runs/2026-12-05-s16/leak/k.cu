extern "C" __global__ void k(int* p) { __shared__ int s[32]; s[threadIdx.x] = threadIdx.x; __syncthreads(); p[threadIdx.x] += s[31 - threadIdx.x]; }
