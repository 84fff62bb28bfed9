/*
 * libsmddpcoll.so: the second library SageMaker's training toolkit
 * (sagemaker-training 4.4.x) looks for under the Python environment's lib/
 * before it lets a job use SMDDP's collectives. Here it holds nothing of its
 * own: it loads libsmddp.so from beside it, which serves them.
 */
#include <smddp/smddp.h>

/* libsmddp's version (SMDDP_VERSION_CODE), read through the library this one loads. */
SMDDP_API int smddpcoll_get_version(void);

int smddpcoll_get_version(void) { return smddp_get_version(); }
