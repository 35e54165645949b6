/* user_words: prints program PROGRAM's user words as meshd reports them, through mesh_shm.h.
 * Usage: user_words SOCKET PROGRAM MAILBOX SLOT; prints "name W0 W1 W2", then "slot W0 W1 W2" read
 * from the mapped mailbox, and exits 2 with meshd's reason when it is refused. */
#include <stdio.h>
#include <stdlib.h>

#include "mesh_shm.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s SOCKET PROGRAM MAILBOX SLOT\n", argv[0]);
        return 64;
    }
    uint32_t words[MESH_USER_WORDS];
    MeshStatus st = mesh_program_user_words(argv[1], argv[2], words, MESH_USER_WORDS);
    if (st != MESH_OK) {
        fprintf(stderr, "%s: %s\n", mesh_shm_strerror(st), mesh_shm_last_error());
        return st == MESH_ERR_REFUSED ? 2 : 1;
    }
    printf("name %u %u %u\n", words[0], words[1], words[2]);

    MeshMailbox *mb = NULL;
    st = mesh_shm_open(argv[3], &mb);
    if (st == MESH_OK) st = mesh_shm_user_words(mb, (uint32_t)strtoul(argv[4], NULL, 10), words, 3);
    if (st != MESH_OK) {
        fprintf(stderr, "%s: %s\n", mesh_shm_strerror(st), mesh_shm_last_error());
        return 1;
    }
    printf("slot %u %u %u\n", words[0], words[1], words[2]);
    mesh_shm_close(mb);
    return 0;
}
