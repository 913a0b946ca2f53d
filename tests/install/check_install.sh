#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then builds a downstream project against it with
# find_package(thc) and with pkg-config, and runs both.
#   check_install.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR
set -euo pipefail
CMAKE=$1 BUILD=$2 SRC=$3 WORK=$4
rm -rf "$WORK" && mkdir -p "$WORK"
PREFIX=$WORK/prefix
"$CMAKE" --install "$BUILD" --prefix "$PREFIX" >/dev/null
test -f "$PREFIX/include/thc/thc.h" && test -f "$PREFIX/include/thc/config.h"
"$CMAKE" -S "$SRC/consumer" -B "$WORK/cmake" -DCMAKE_PREFIX_PATH="$PREFIX" >/dev/null
"$CMAKE" --build "$WORK/cmake" >/dev/null
LD_LIBRARY_PATH=$PREFIX/lib:$PREFIX/lib64 "$WORK/cmake/consumer"
# pkg-config: the .pc file carries the configure-time prefix; point it at the scratch prefix.
PC=$(ls "$PREFIX"/lib*/pkgconfig/thc.pc)
FLAGS=$(PKG_CONFIG_PATH=$(dirname "$PC") pkg-config --define-variable=prefix="$PREFIX" --cflags --libs thc)
cc "$SRC/consumer/main.c" -o "$WORK/consumer_pc" $FLAGS -lm
LD_LIBRARY_PATH=$PREFIX/lib:$PREFIX/lib64 "$WORK/consumer_pc"
echo "install ok"
