// hello: a first resident program. Every message that arrives on binding 0 goes back on binding 1
// in capital letters, until meshd asks the program to stop.
#include "mesh.cuh"

MESH_BINDINGS(MESH_LL, MESH_LL);                               // meshd refuses other channels

extern "C" __global__ void mesh_main(mesh_ctx ctx) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;           // one thread does the work
    uint64_t beat = mesh_begin(ctx);
    mesh_chan in = mesh_chan_open(ctx, 0, false), out = mesh_chan_open(ctx, 1, true);
    char msg[256];                                             // messages up to 256 bytes
    if (in.msg_size == 0 || in.msg_size != out.msg_size || in.msg_size > sizeof(msg)) {
        mesh_exit(ctx, 1);                                     // bound to the wrong channels
        return;
    }
    while (!mesh_should_stop(ctx)) {
        if (mesh_chan_room(&out) > 0 && mesh_try_recv(&in, msg)) {
            for (uint32_t i = 0; i < in.msg_size; i++)
                if (msg[i] >= 'a' && msg[i] <= 'z') msg[i] -= 'a' - 'A';
            mesh_try_send(&out, msg);
        }
        mesh_heartbeat(ctx, ++beat);                           // tells meshd the program is alive
    }
    mesh_chan_close(&in);                                      // the next launch resumes exactly here
    mesh_chan_close(&out);
    mesh_end(ctx);
}
