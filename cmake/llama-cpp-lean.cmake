# Read by llama.cpp's project() when pip compiles llama-cpp-python for the CPU engine (the Makefile
# passes -DCMAKE_PROJECT_llama.cpp_INCLUDE=<this file> through CMAKE_ARGS).
#
# llama-cpp-python forces LLAMA_BUILD_COMMON on, yet its Python bindings load only libllama and
# the ggml libraries: the common library (argument parsing, chat parsers, the HTTP client of the
# C++ tools) took 44% of the compile (job-seconds in ninja's log, llama-cpp-python 0.3.36). A
# normal variable shadows the forced cache entry inside llama.cpp's directory (policies CMP0077
# and CMP0126), so common, the HTTP library and common's install rule are skipped. Should a later
# llama.cpp rename the option, this line does nothing and the build is only slower; should later
# bindings load libllama-common, the Makefile's `import llama_cpp` after the build fails, and
# this file goes.
set(LLAMA_BUILD_COMMON OFF)
