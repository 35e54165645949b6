cd .gpu/probe && nvcc -o modleak modleak.cu -lcuda || exit 1
nvcc -cubin -arch=sm_90 -I ../next/programs -o v2.cubin v2.cu
for v in v5 v6; do nvcc -cubin -arch=sm_90 -o $v.cubin $v.cu || echo "nvcc $v failed"; echo "$v: $(timeout 30 ./modleak $v.cubin 0 1200 mesh_main | awk '{print $6}' | tr '\n' ' ')"; done
echo "v2 6000: $(timeout 60 ./modleak v2.cubin 0 6000 mesh_main | awk '{print $6}' | tr '\n' ' ')"
cuobjdump -sass v2.cubin | grep -E "MEMBAR|FENCE|ERRBAR|CCTL" | head; cuobjdump -sass v5.cubin | grep -E "MEMBAR|FENCE|ERRBAR|CCTL" | head
