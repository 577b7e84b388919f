#!/usr/bin/env bash
# `make install` gives a user what they need: headers, the library, a
# pkg-config file and a CMake package. Installs the build into a scratch
# prefix, then builds examples/fabric_mlp.c both ways and runs it.
. "$(dirname "$0")/../cli/lib.sh"
prefix="$T_TMP/prefix"
# A sanitizer build installs an instrumented library: the user's program
# needs the same flags to link against it.
san=""
grep -q '^FULGUR_SANITIZE:BOOL=ON' "$FG_BIN_DIR/CMakeCache.txt" 2>/dev/null && san="-fsanitize=address,undefined"
run install cmake --install "$FG_BIN_DIR" --prefix "$prefix"
expect_rc "cmake --install" 0 install
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
run pc bash -c "gcc $san '$FG_SRC/examples/fabric_mlp.c' -o '$T_TMP/ex_pc' \$(pkg-config --cflags --libs fulgur) -Wl,-rpath,'$prefix/lib' && '$T_TMP/ex_pc' --steps 20"
expect_rc "built with pkg-config --cflags --libs fulgur, runs" 0 pc
mkdir -p "$T_TMP/user"
cat >"$T_TMP/user/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.18)
project(user C)
find_package(fulgur REQUIRED)
add_executable(ex $FG_SRC/examples/fabric_mlp.c)
target_link_libraries(ex fulgur::fulgur)
CM
run cm bash -c "cmake -S '$T_TMP/user' -B '$T_TMP/user/b' -DCMAKE_PREFIX_PATH='$prefix' -DCMAKE_C_FLAGS='$san' && cmake --build '$T_TMP/user/b' && '$T_TMP/user/b/ex' --steps 20"
expect_rc "built with find_package(fulgur), runs" 0 cm
finish
