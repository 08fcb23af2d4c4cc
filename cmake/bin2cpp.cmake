# Turns a binary file into a C++ source defining
#   extern "C" const unsigned char <SYMBOL>[];  extern "C" const unsigned long <SYMBOL>_size;
# Usage: cmake -DINPUT=<file> -DOUTPUT=<file.cpp> -DSYMBOL=<name> -P bin2cpp.cmake
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR size "${hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x..,){32})" "\\1\n" body "${body}")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/bin2cpp.cmake. Do not edit.\n"
  "extern \"C\" const unsigned char ${SYMBOL}[] = {\n${body}\n};\n"
  "extern \"C\" const unsigned long ${SYMBOL}_size = ${size};\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
