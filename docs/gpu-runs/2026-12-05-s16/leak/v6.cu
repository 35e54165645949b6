extern "C" __global__ void mesh_main(unsigned* p) { asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(p), "r"(1u) : "memory"); }
