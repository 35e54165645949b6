/* delete: deletes channel CHANNEL (dropping what it holds), then service SERVICE, through mesh_shm.h.
 * Usage: delete SOCKET CHANNEL SERVICE; prints "channel N" and "service N" (N: messages discarded),
 * and exits 2 with meshd's reason when a delete is refused. */
#include <stdio.h>

#include "mesh_shm.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SOCKET CHANNEL SERVICE\n", argv[0]);
        return 64;
    }
    uint64_t discarded = 0;
    MeshStatus st = mesh_channel_delete(argv[1], argv[2], 1, &discarded);
    if (st == MESH_OK) {
        printf("channel %llu\n", (unsigned long long)discarded);
        st = mesh_service_delete(argv[1], argv[3], 0, &discarded);
    }
    if (st != MESH_OK) {
        fprintf(stderr, "%s: %s\n", mesh_shm_strerror(st), mesh_shm_last_error());
        return st == MESH_ERR_REFUSED ? 2 : 1;
    }
    printf("service %llu\n", (unsigned long long)discarded);
    return 0;
}
