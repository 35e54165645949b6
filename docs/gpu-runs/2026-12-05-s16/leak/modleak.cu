// modleak: does a raw load / launch / unload cycle of a module grow the GPU's memory in use?
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define CK(x) do { CUresult r = (x); if (r) { const char* s; cuGetErrorString(r, &s); printf("%s: %s\n", #x, s); exit(1);} } while (0)
static size_t used() { size_t f, t; cuMemGetInfo(&f, &t); return (t - f) >> 10; }
int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb"); std::vector<char> img(1 << 22); size_t n = fread(img.data(), 1, img.size() - 1, f); img[n] = 0; fclose(f);
    int mode = atoi(argv[2]); int iters = atoi(argv[3]);
    CUdevice d; CUcontext c; CK(cuInit(0)); CK(cuDeviceGet(&d, 0)); CK(cuDevicePrimaryCtxRetain(&c, d)); CK(cuCtxSetCurrent(c));
    CUdeviceptr buf; CK(cuMemAlloc(&buf, 4096));
    for (int i = 0; i <= iters; i++) {
        if (i % (iters / 12) == 0) printf("mode %d iter %d used %zu KiB\n", mode, i, used());
        if (i == iters) break;
        CUmodule m; CUfunction fn; CUstream s; CUlibrary lib; CUkernel kern;
        if (mode == 2) { CK(cuLibraryLoadData(&lib, img.data(), 0, 0, 0, 0, 0, 0)); CK(cuLibraryGetKernel(&kern, lib, argc > 4 ? argv[4] : "k")); CK(cuKernelGetFunction(&fn, kern)); }
        else { CK(cuModuleLoadData(&m, img.data())); CK(cuModuleGetFunction(&fn, m, argc > 4 ? argv[4] : "k")); }
        CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        void* args[] = {&buf};
        if (mode == 1) CK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, args, 0));
        CK(cuStreamSynchronize(s)); CK(cuStreamDestroy(s));
        if (mode == 2) CK(cuLibraryUnload(lib)); else CK(cuModuleUnload(m));
    }
    return 0;
}
