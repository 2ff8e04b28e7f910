/* version: kvbridge's version string. */
#ifndef KVB_VERSION_H
#define KVB_VERSION_H
#define KVB_VERSION "0.2.0"
#endif
