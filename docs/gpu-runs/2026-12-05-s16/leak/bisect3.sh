cd .gpu/probe && nvcc -o modleak modleak.cu -lcuda || exit 1
nvcc -cubin -arch=sm_90 -I ../next/programs -o v2.cubin v2.cu
echo "v2 module lazy:  $(timeout 60 ./modleak v2.cubin 0 2400 mesh_main | awk '{print $6}' | tr '\n' ' ')"
echo "v2 module eager: $(CUDA_MODULE_LOADING=EAGER timeout 60 ./modleak v2.cubin 0 2400 mesh_main | awk '{print $6}' | tr '\n' ' ')"
echo "v2 library lazy: $(timeout 60 ./modleak v2.cubin 2 2400 mesh_main | awk '{print $6}' | tr '\n' ' ')"
echo "v2 library eager: $(CUDA_MODULE_LOADING=EAGER timeout 60 ./modleak v2.cubin 2 2400 mesh_main | awk '{print $6}' | tr '\n' ' ')"
