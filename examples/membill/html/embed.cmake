# Writes OUT, a C file defining the NUL-terminated array NAME with the bytes of IN, so that the
# page's script and style live in files of their own and still travel inside the binary.
file(READ ${IN} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
file(WRITE ${OUT} "const char ${NAME}[] = {${hex}0x00};\n")
