# Runs a command test (tests/CMakeLists.txt: `bash isolated.bash SCRIPT ARGS...`) with its own
# easel cache folder and home: XDG_CACHE_HOME and HOME point into a new temporary folder,
# removed afterwards, so no test reads or writes the user's ~/.cache/easel and no two tests share
# cache entries (tests/support/isolated_cache.cpp does the same for easel_tests).
home=$(mktemp -d)
mkdir -p "$home/cache"
export XDG_CACHE_HOME="$home/cache" HOME="$home"
bash "$@"
rc=$?
rm -rf "$home"
exit $rc
