# Install rules and packages: `cmake --install <build> --prefix P` gives
#   P/bin      gradsyncd, gradsync-run, gradsync-train (the demo), gradsyncctl
#   P/lib      libgradsync.so.0 (soname), libgradsync.a (self-contained),
#              pkgconfig/gradsync.pc, cmake/gradsync/ (find_package(gradsync))
#   P/include  gradsync.h
# Programs carry RPATH $ORIGIN/../lib, so they run from any prefix without
# LD_LIBRARY_PATH; gradsync.pc and the CMake package find their prefix from
# where they lie, so the tree can be moved. `cpack -G DEB` packs the same
# tree as two Debian packages (programs + shared library; development files),
# their dependencies computed by dpkg-shlibdeps.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# pkg-config modules a program linking libgradsync.a statically needs, in
# gradsync.pc's Requires.private and the CMake package's static target. A
# dependency added to gs_common, gs_proto or the worker must be added here
# too (test_install links statically and fails otherwise).
set(GRADSYNC_PC_REQUIRES grpc libprotobuf-c)
set(GRADSYNC_PC_LIBS_PRIVATE "-lm -pthread")
if(GS_HAVE_NCCL) # the nccl backend: NCCL and the CUDA runtime, where the build found them
  get_filename_component(gs_nccl_dir ${NCCL_LIBRARY} DIRECTORY)
  get_filename_component(gs_cudart_dir ${CUDA_cudart_LIBRARY} DIRECTORY)
  string(APPEND GRADSYNC_PC_LIBS_PRIVATE
    " -L${gs_nccl_dir} -Wl,-rpath,${gs_nccl_dir} -lnccl -L${gs_cudart_dir} -Wl,-rpath,${gs_cudart_dir} -lcudart -lstdc++")
endif()

set(gs_programs gradsyncd gradsync-run gradsync-train)
if(TARGET gradsyncctl)
  list(APPEND gs_programs gradsyncctl)
endif()
set_target_properties(${gs_programs} PROPERTIES INSTALL_RPATH "$ORIGIN/../${CMAKE_INSTALL_LIBDIR}")
install(TARGETS ${gs_programs} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

install(TARGETS gradsync EXPORT gradsync-targets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS gradsync_static EXPORT gradsync-static-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(FILES worker/include/gradsync.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT dev)

# gradsync.pc: prefix relative to the file's own directory (relocatable).
file(RELATIVE_PATH gs_pc_up "/r/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/r")
string(REGEX REPLACE "/$" "" gs_pc_up "${gs_pc_up}")
string(REPLACE ";" " " gs_pc_requires "${GRADSYNC_PC_REQUIRES}")
configure_file(cmake/gradsync.pc.in ${CMAKE_BINARY_DIR}/gradsync.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/gradsync.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
  COMPONENT dev)

# CMake package: gradsync::gradsync (shared) and, where pkg-config finds
# gRPC and protobuf-c, gradsync::gradsync_static.
set(gs_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/gradsync)
install(EXPORT gradsync-targets NAMESPACE gradsync:: DESTINATION ${gs_cmake_dir} COMPONENT dev)
install(EXPORT gradsync-static-targets NAMESPACE gradsync:: DESTINATION ${gs_cmake_dir}
  COMPONENT dev)
configure_package_config_file(cmake/gradsyncConfig.cmake.in
  ${CMAKE_BINARY_DIR}/gradsyncConfig.cmake INSTALL_DESTINATION ${gs_cmake_dir})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/gradsyncConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/gradsyncConfig.cmake
  ${CMAKE_BINARY_DIR}/gradsyncConfigVersion.cmake DESTINATION ${gs_cmake_dir} COMPONENT dev)

# ---- cpack -G DEB ------------------------------------------------------------
set(CPACK_PACKAGE_NAME gradsync)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "gradsync maintainers <gradsync@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "gRPC coordinator and worker library that keep distributed training ranks in lock-step")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME gradsync)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME gradsync-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# The dev package's own files are a header, an archive and text: nothing for
# shlibdeps to find. Its dependencies are the runtime package and the -dev
# packages of GRADSYNC_PC_REQUIRES (pkg-config module -> Debian package).
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS
  "gradsync (= ${PROJECT_VERSION}), libgrpc-dev, libprotobuf-c-dev, pkg-config")
set(CPACK_COMPONENT_DEV_DEPENDS runtime)
include(CPack)
