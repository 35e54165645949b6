// mesh/detail/removed.cuh: build options that no longer exist. Each fails the build with what replaces
// it, so that a program built with an old -D flag does not silently get a different behaviour.
#pragma once

#ifdef MESH_PHASE_LOCK
#error "MESH_PHASE_LOCK was removed: mesh_warp_try_recv polls on every call; drop the definition"
#endif
#ifdef MESH_PHASE_UP
#error "MESH_PHASE_UP was removed with the phase lock: mesh_warp_try_recv polls on every call; drop the definition"
#endif
#ifdef MESH_PHASE_DOWN
#error "MESH_PHASE_DOWN was removed with the phase lock: mesh_warp_try_recv polls on every call; drop the definition"
#endif
#ifdef MESH_PHASE_MAX
#error "MESH_PHASE_MAX was removed with the phase lock: mesh_warp_try_recv polls on every call; drop the definition"
#endif
#ifdef MESH_PHASE_CHOOSE
#error "MESH_PHASE_CHOOSE was removed with the phase lock: mesh_warp_try_recv polls on every call; drop the definition"
#endif
#if defined(MESH_POLLERS) || defined(MESH_POLL_SPACING_NS) || defined(MESH_POLL_MAX_PAIRS)
#error "the poll stream (MESH_POLLERS, MESH_POLL_SPACING_NS, MESH_POLL_MAX_PAIRS, mesh_poll_*) was removed: receive with one warp's mesh_warp_try_recv"
#endif
#ifdef MESH_FANIN_PREFETCH
#error "MESH_FANIN_PREFETCH was removed: mesh_fanin_peek loads each batch when called; drop the definition"
#endif
#ifdef MESH_REPLY_SPREAD
#error "MESH_REPLY_SPREAD was removed: mesh_reply_many always spreads each reply over the warp's lanes; drop the definition"
#endif
#ifdef MESH_LEAN_PAIRS
#error "MESH_LEAN_PAIRS was removed: mesh_warp_try_recv's short path is fixed at 1 KiB; drop the definition"
#endif
#ifdef MESH_FANIN_POLL_MIN
#error "MESH_FANIN_POLL_MIN was removed: a fixed constant now; drop the definition"
#endif
#if defined(MESH_PROTOCOL_FANIN) || defined(MESH_PROTOCOL_GROUP)
#error "MESH_PROTOCOL_FANIN / MESH_PROTOCOL_GROUP are protocol codes of the mailbox, not options: drop the definition"
#endif
