/* A service client in C against mesh_shm.h (compiled and run by tests/service.rs): attaches, streams
 * sequence-checked requests, checks every reply, detaches.
 *
 *     service_client SOCKET SERVICE COUNT
 *
 * Prints "id N" once attached, "done K" every 100 round trips and "ok COUNT" at the end (COUNT 0: for
 * ever, until killed). Request k carries k in its first u32 word, the client's id in the second and
 * (k * 7 + id + i) & 0xff in every further byte i; the reply must be the same bytes with the first word
 * k + 1. Exit status: 0 done, 2 usage, 3 a wrong reply, 4 a call failed (its status and text on stderr). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh_shm.h"

static int failed(const char *what, MeshStatus st) {
  fprintf(stderr, "%s: %d (%s): %s\n", what, st, mesh_shm_strerror(st), mesh_shm_last_error());
  return 4;
}

static void fill(uint8_t *msg, size_t size, uint32_t k, uint32_t id) {
  for (size_t i = 0; i < size; i++) msg[i] = (uint8_t)((k * 7u + id + (uint32_t)i) & 0xffu);
  memcpy(msg, &k, 4);
  memcpy(msg + 4, &id, 4);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s SOCKET SERVICE COUNT\n", argv[0]);
    return 2;
  }
  long count = strtol(argv[3], NULL, 10);
  MeshService *svc = NULL;
  MeshStatus st = mesh_service_connect(argv[1], argv[2], &svc);
  if (st != MESH_OK) return failed("mesh_service_connect", st);
  MeshServiceInfo info;
  if ((st = mesh_service_info(svc, &info)) != MESH_OK) return failed("mesh_service_info", st);
  uint32_t id = 0;
  if ((st = mesh_service_id(svc, &id)) != MESH_OK || id != info.id) return failed("mesh_service_id", st);
  if (info.msg_size < 8 || info.reply_size < info.msg_size) {
    fprintf(stderr, "this client wants replies at least as long as requests of 8 bytes or more\n");
    return 2;
  }
  printf("id %u\n", id);
  fflush(stdout);
  uint8_t *msg = calloc(info.msg_size, 1), *want = calloc(info.reply_size, 1), *got = calloc(info.reply_size, 1);
  if (!msg || !want || !got) return 2;
  /* A reply buffer of the wrong size is refused before anything is sent. */
  if ((st = mesh_service_request(svc, msg, info.msg_size, got, info.reply_size - 1, 1000)) != MESH_ERR_MSG_SIZE)
    return failed("mesh_service_request with a short reply buffer", st);
  for (uint32_t k = 0; count == 0 || k < (uint32_t)count; k++) {
    fill(msg, info.msg_size, k, id);
    memset(want, 0, info.reply_size);
    memcpy(want, msg, info.msg_size);
    uint32_t next = k + 1;
    memcpy(want, &next, 4);
    if (k % 2 == 0) {
      st = mesh_service_request(svc, msg, info.msg_size, got, info.reply_size, 30000);
      if (st != MESH_OK) return failed("mesh_service_request", st);
    } else {
      /* The split calls: a try_send (the ring has room: one request in flight), then wait. */
      st = mesh_service_try_send(svc, msg, info.msg_size);
      if (st != MESH_OK) return failed("mesh_service_try_send", st);
      while ((st = mesh_service_try_recv(svc, got, info.reply_size)) == MESH_EMPTY) {
      }
      if (st != MESH_OK) return failed("mesh_service_try_recv", st);
    }
    if (memcmp(got, want, info.reply_size) != 0) {
      uint32_t w0;
      memcpy(&w0, got, 4);
      fprintf(stderr, "reply %u: first word %u, expected %u (or another byte differs)\n", k, w0, next);
      return 3;
    }
    if ((k + 1) % 100 == 0) {
      printf("done %u\n", k + 1);
      fflush(stdout);
    }
  }
  if ((st = mesh_service_recv(svc, got, info.reply_size, 1)) != MESH_TIMEOUT) return failed("a recv with nothing due", st);
  if ((st = mesh_service_close(svc)) != MESH_OK) return failed("mesh_service_close", st);
  printf("ok %ld\n", count);
  free(msg);
  free(want);
  free(got);
  return 0;
}
