/* Root attributes written into a closed tap file (a golden's calibration and
 * marker are added after the run that wrote the file). */
#include <hdf5.h>

#include "tapfile.h"

int td_tapfile_attr_put(const char *path, const char *key, const char *str, const double *num, td_err *err) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) return td_err_set(err, TD_EINPUT, "%s: cannot open it for writing attributes", path);
    int rc = TD_OK;
    hid_t type = -1, space = H5Screate(H5S_SCALAR), a = -1;
    if (H5Aexists(f, key) > 0) H5Adelete(f, key);
    if (str) {
        type = H5Tcopy(H5T_C_S1);
        H5Tset_size(type, H5T_VARIABLE);
        H5Tset_cset(type, H5T_CSET_UTF8);
        a = H5Acreate2(f, key, type, space, H5P_DEFAULT, H5P_DEFAULT);
        if (a < 0 || H5Awrite(a, type, &str) < 0) rc = TD_EINTERNAL;
    } else {
        a = H5Acreate2(f, key, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
        if (a < 0 || H5Awrite(a, H5T_NATIVE_DOUBLE, num) < 0) rc = TD_EINTERNAL;
    }
    if (a >= 0) H5Aclose(a);
    if (type >= 0) H5Tclose(type);
    H5Sclose(space);
    if (H5Fclose(f) < 0) rc = TD_EINTERNAL;
    if (rc) td_err_set(err, rc, "%s: cannot write attribute '%s'", path, key);
    return rc;
}

