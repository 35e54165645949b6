cd .gpu/probe && nvcc -o modleak modleak.cu -lcuda || exit 1
for v in v1 v2 v3 v4; do nvcc -cubin -arch=sm_90 -I ../next/programs -o $v.cubin $v.cu || echo "nvcc $v failed"; echo "$v: $(timeout 30 ./modleak $v.cubin 0 1200 mesh_main | awk '{print $6}' | tr '\n' ' ')"; done
nvcc -cubin -arch=sm_90 -I ../next/programs -o hb.cubin ../next/programs/heartbeat.cu
for c in k hb v1 v2; do echo "== $c"; cuobjdump -elf $c.cubin 2>&1 | grep -E "^\s+\[|\.nv\.|section" | awk '{print $2, $3, $4, $5, $6}' | grep -v "^ *$" | head -30; done
