# Included from tests/transfer/CMakeLists.txt: the transfer plumbing's tests.
foreach(t test_xfer_handshake test_xfer_side_channel test_xfer_ucx_agent test_xfer_connector)
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${t}.c)
    kvf_add_test(NAME ${t} SOURCES ${t}.c LIBS kvf_transfer TIMEOUT 60)
  endif()
endforeach()

find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  # Two processes per cell over loopback UCX; default transports, then TCP only.
  foreach(tls default tcp,self)
    string(REPLACE "," "_" tag ${tls})
    foreach(model tiny-hybrid tiny-dense qwen3-0.6b)
      kvf_add_script_test(NAME xfer_matrix_${model}_${tag}
        COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/xfer_matrix.py
                --tls ${tls} --models ${model}
        TIMEOUT 120)
    endforeach()
    kvf_add_script_test(NAME xfer_faults_${tag}
      COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/xfer_faults.py --tls ${tls}
      TIMEOUT 60)
  endforeach()
endif()

# The agent test again with TCP only (RMA emulated over active messages).
if(TARGET test_xfer_ucx_agent)
  add_test(NAME test_xfer_ucx_agent_tcp COMMAND test_xfer_ucx_agent)
  set_tests_properties(test_xfer_ucx_agent_tcp PROPERTIES TIMEOUT 60
    ENVIRONMENT "UCX_TLS=tcp,self;KVF_SOURCE_DIR=${CMAKE_SOURCE_DIR}")
endif()

# kvf bench smoke: the KV-shaped pull, the raw GET and their ratio are printed.
kvf_add_script_test(NAME xfer_bench_smoke
  COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/xfer_bench_smoke.sh TIMEOUT 60)
