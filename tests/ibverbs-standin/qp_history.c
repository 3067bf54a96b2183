/*
 * qp_history.c - drive one RC queue pair through
 *   create -> INIT -> RTR -> RTS -> ERR -> destroy
 * through the *real* libibverbs.so.1 entry points (ibv_alloc_pd,
 * ibv_create_cq, ibv_create_qp, ibv_modify_qp, ibv_destroy_qp,
 * ibv_destroy_cq, ibv_dealloc_pd, default versions @@IBVERBS_1.1) on a host
 * with no RDMA device.
 *
 * The stand-in sits where a hardware provider (mlx5, rxe, ...) sits: below
 * libibverbs.  We build a fake `struct verbs_device`, let libibverbs itself
 * initialise a `struct verbs_context` with the provider API it exports as
 * @IBVERBS_PRIVATE_34 (_verbs_init_and_alloc_context, verbs_set_ops,
 * verbs_uninit_context), and install stand-in provider ops.  Every ibv_*
 * call below therefore enters libibverbs' own code, which dispatches through
 * get_ops(ctx)->op and (for ibv_modify_qp) writes qp->state itself.
 *
 * Build: cc -O1 -g -Wall -Wextra -o /tmp/qp_history \
 *            tests/ibverbs-standin/qp_history.c -libverbs
 * Usage: qp_history [--wait-stdin]
 *
 * The two private layouts below (struct standin_verbs_device and
 * struct standin_verbs_context_ops) are our own declarations, written to
 * match rdma-core tag v44.0, file libibverbs/driver.h (struct verbs_device,
 * struct verbs_context_ops), which is the source of Debian's libibverbs1
 * 44.0-2.  They are checked at run time (see check_layouts()).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Private provider ABI of libibverbs (IBVERBS_PRIVATE_34), rdma-core v44.0 */
/* ------------------------------------------------------------------------ */

struct verbs_mr;              /* private, only used as a pointer type here */

/* ccan/list.h struct list_node: two pointers. */
struct standin_list_node {
	struct standin_list_node *next, *prev;
};

/*
 * Same field order/types as `struct verbs_device` in rdma-core v44.0
 * libibverbs/driver.h.  libibverbs reaches `refcount` via
 * container_of(ibv_device, struct verbs_device, device)
 * (ibverbs_device_hold/put in libibverbs/init.c).
 */
struct standin_verbs_device {
	struct ibv_device device;          /* must be first */
	const void *ops;                   /* const struct verbs_device_ops * */
	atomic_int refcount;
	struct standin_list_node entry;
	void *sysfs;                       /* struct verbs_sysfs_dev * */
	uint64_t core_support;
};
_Static_assert(offsetof(struct standin_verbs_device, device) == 0,
	       "ibv_device must be first in verbs_device");
_Static_assert(offsetof(struct standin_verbs_device, refcount) ==
		       sizeof(struct ibv_device) + sizeof(void *),
	       "verbs_device.refcount offset");

/*
 * Same field order/types as `struct verbs_context_ops` in rdma-core v44.0
 * libibverbs/driver.h (76 function pointers, kept sorted there).  Every
 * member is declared because the offset of each op depends on all before it
 * and verbs_set_ops() (libibverbs/dummy_ops.c) reads all 76.
 */
struct standin_verbs_context_ops {
	int (*advise_mr)(struct ibv_pd *pd, enum ibv_advise_mr_advice advice,
			 uint32_t flags, struct ibv_sge *sg_list,
			 uint32_t num_sges);                              /*  0 */
	struct ibv_dm *(*alloc_dm)(struct ibv_context *context,
				   struct ibv_alloc_dm_attr *attr);        /*  1 */
	struct ibv_mw *(*alloc_mw)(struct ibv_pd *pd, enum ibv_mw_type type); /*  2 */
	struct ibv_mr *(*alloc_null_mr)(struct ibv_pd *pd);                /*  3 */
	struct ibv_pd *(*alloc_parent_domain)(
		struct ibv_context *context,
		struct ibv_parent_domain_init_attr *attr);                 /*  4 */
	struct ibv_pd *(*alloc_pd)(struct ibv_context *context);           /*  5 */
	struct ibv_td *(*alloc_td)(struct ibv_context *context,
				   struct ibv_td_init_attr *init_attr);    /*  6 */
	void (*async_event)(struct ibv_context *context,
			    struct ibv_async_event *event);                /*  7 */
	int (*attach_counters_point_flow)(struct ibv_counters *counters,
					  struct ibv_counter_attach_attr *attr,
					  struct ibv_flow *flow);          /*  8 */
	int (*attach_mcast)(struct ibv_qp *qp, const union ibv_gid *gid,
			    uint16_t lid);                                 /*  9 */
	int (*bind_mw)(struct ibv_qp *qp, struct ibv_mw *mw,
		       struct ibv_mw_bind *mw_bind);                       /* 10 */
	int (*close_xrcd)(struct ibv_xrcd *xrcd);                          /* 11 */
	void (*cq_event)(struct ibv_cq *cq);                               /* 12 */
	struct ibv_ah *(*create_ah)(struct ibv_pd *pd,
				    struct ibv_ah_attr *attr);             /* 13 */
	struct ibv_counters *(*create_counters)(
		struct ibv_context *context,
		struct ibv_counters_init_attr *init_attr);                 /* 14 */
	struct ibv_cq *(*create_cq)(struct ibv_context *context, int cqe,
				    struct ibv_comp_channel *channel,
				    int comp_vector);                      /* 15 */
	struct ibv_cq_ex *(*create_cq_ex)(
		struct ibv_context *context,
		struct ibv_cq_init_attr_ex *init_attr);                    /* 16 */
	struct ibv_flow *(*create_flow)(struct ibv_qp *qp,
					struct ibv_flow_attr *flow_attr);  /* 17 */
	struct ibv_flow_action *(*create_flow_action_esp)(
		struct ibv_context *context,
		struct ibv_flow_action_esp_attr *attr);                    /* 18 */
	struct ibv_qp *(*create_qp)(struct ibv_pd *pd,
				    struct ibv_qp_init_attr *attr);        /* 19 */
	struct ibv_qp *(*create_qp_ex)(
		struct ibv_context *context,
		struct ibv_qp_init_attr_ex *qp_init_attr_ex);              /* 20 */
	struct ibv_rwq_ind_table *(*create_rwq_ind_table)(
		struct ibv_context *context,
		struct ibv_rwq_ind_table_init_attr *init_attr);            /* 21 */
	struct ibv_srq *(*create_srq)(struct ibv_pd *pd,
				      struct ibv_srq_init_attr *srq_init_attr); /* 22 */
	struct ibv_srq *(*create_srq_ex)(
		struct ibv_context *context,
		struct ibv_srq_init_attr_ex *srq_init_attr_ex);            /* 23 */
	struct ibv_wq *(*create_wq)(struct ibv_context *context,
				    struct ibv_wq_init_attr *wq_init_attr); /* 24 */
	int (*dealloc_mw)(struct ibv_mw *mw);                              /* 25 */
	int (*dealloc_pd)(struct ibv_pd *pd);                              /* 26 */
	int (*dealloc_td)(struct ibv_td *td);                              /* 27 */
	int (*dereg_mr)(struct verbs_mr *vmr);                             /* 28 */
	int (*destroy_ah)(struct ibv_ah *ah);                              /* 29 */
	int (*destroy_counters)(struct ibv_counters *counters);            /* 30 */
	int (*destroy_cq)(struct ibv_cq *cq);                              /* 31 */
	int (*destroy_flow)(struct ibv_flow *flow);                        /* 32 */
	int (*destroy_flow_action)(struct ibv_flow_action *action);        /* 33 */
	int (*destroy_qp)(struct ibv_qp *qp);                              /* 34 */
	int (*destroy_rwq_ind_table)(struct ibv_rwq_ind_table *rwq_ind_table); /* 35 */
	int (*destroy_srq)(struct ibv_srq *srq);                           /* 36 */
	int (*destroy_wq)(struct ibv_wq *wq);                              /* 37 */
	int (*detach_mcast)(struct ibv_qp *qp, const union ibv_gid *gid,
			    uint16_t lid);                                 /* 38 */
	void (*free_context)(struct ibv_context *context);                 /* 39 */
	int (*free_dm)(struct ibv_dm *dm);                                 /* 40 */
	int (*get_srq_num)(struct ibv_srq *srq, uint32_t *srq_num);        /* 41 */
	struct ibv_dm *(*import_dm)(struct ibv_context *context,
				    uint32_t dm_handle);                   /* 42 */
	struct ibv_mr *(*import_mr)(struct ibv_pd *pd, uint32_t mr_handle); /* 43 */
	struct ibv_pd *(*import_pd)(struct ibv_context *context,
				    uint32_t pd_handle);                   /* 44 */
	int (*modify_cq)(struct ibv_cq *cq, struct ibv_modify_cq_attr *attr); /* 45 */
	int (*modify_flow_action_esp)(struct ibv_flow_action *action,
				      struct ibv_flow_action_esp_attr *attr); /* 46 */
	int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			 int attr_mask);                                   /* 47 */
	int (*modify_qp_rate_limit)(struct ibv_qp *qp,
				    struct ibv_qp_rate_limit_attr *attr);  /* 48 */
	int (*modify_srq)(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
			  int srq_attr_mask);                              /* 49 */
	int (*modify_wq)(struct ibv_wq *wq, struct ibv_wq_attr *wq_attr);  /* 50 */
	struct ibv_qp *(*open_qp)(struct ibv_context *context,
				  struct ibv_qp_open_attr *attr);          /* 51 */
	struct ibv_xrcd *(*open_xrcd)(
		struct ibv_context *context,
		struct ibv_xrcd_init_attr *xrcd_init_attr);                /* 52 */
	int (*poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc); /* 53 */
	int (*post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			 struct ibv_recv_wr **bad_wr);                     /* 54 */
	int (*post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr,
			 struct ibv_send_wr **bad_wr);                     /* 55 */
	int (*post_srq_ops)(struct ibv_srq *srq, struct ibv_ops_wr *op,
			    struct ibv_ops_wr **bad_op);                   /* 56 */
	int (*post_srq_recv)(struct ibv_srq *srq, struct ibv_recv_wr *recv_wr,
			     struct ibv_recv_wr **bad_recv_wr);            /* 57 */
	int (*query_device_ex)(struct ibv_context *context,
			       const struct ibv_query_device_ex_input *input,
			       struct ibv_device_attr_ex *attr,
			       size_t attr_size);                          /* 58 */
	int (*query_ece)(struct ibv_qp *qp, struct ibv_ece *ece);          /* 59 */
	int (*query_port)(struct ibv_context *context, uint8_t port_num,
			  struct ibv_port_attr *port_attr);                /* 60 */
	int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			int attr_mask, struct ibv_qp_init_attr *init_attr); /* 61 */
	int (*query_qp_data_in_order)(struct ibv_qp *qp, enum ibv_wr_opcode op,
				      uint32_t flags);                     /* 62 */
	int (*query_rt_values)(struct ibv_context *context,
			       struct ibv_values_ex *values);              /* 63 */
	int (*query_srq)(struct ibv_srq *srq, struct ibv_srq_attr *srq_attr); /* 64 */
	int (*read_counters)(struct ibv_counters *counters,
			     uint64_t *counters_value, uint32_t ncounters,
			     uint32_t flags);                              /* 65 */
	struct ibv_mr *(*reg_dm_mr)(struct ibv_pd *pd, struct ibv_dm *dm,
				    uint64_t dm_offset, size_t length,
				    unsigned int access);                  /* 66 */
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *pd, uint64_t offset,
					size_t length, uint64_t iova, int fd,
					int access);                       /* 67 */
	struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length,
				 uint64_t hca_va, int access);             /* 68 */
	int (*req_notify_cq)(struct ibv_cq *cq, int solicited_only);       /* 69 */
	int (*rereg_mr)(struct verbs_mr *vmr, int flags, struct ibv_pd *pd,
			void *addr, size_t length, int access);            /* 70 */
	int (*resize_cq)(struct ibv_cq *cq, int cqe);                      /* 71 */
	int (*set_ece)(struct ibv_qp *qp, struct ibv_ece *ece);            /* 72 */
	void (*unimport_dm)(struct ibv_dm *dm);                            /* 73 */
	void (*unimport_mr)(struct ibv_mr *mr);                            /* 74 */
	void (*unimport_pd)(struct ibv_pd *pd);                            /* 75 */
};
#define STANDIN_NUM_OPS 76
_Static_assert(sizeof(struct standin_verbs_context_ops) ==
		       STANDIN_NUM_OPS * sizeof(void (*)(void)),
	       "verbs_context_ops: 76 function pointers, no padding");
_Static_assert(offsetof(struct standin_verbs_context_ops, alloc_pd) == 5 * 8 &&
		       offsetof(struct standin_verbs_context_ops, create_cq) == 15 * 8 &&
		       offsetof(struct standin_verbs_context_ops, create_qp) == 19 * 8 &&
		       offsetof(struct standin_verbs_context_ops, dealloc_pd) == 26 * 8 &&
		       offsetof(struct standin_verbs_context_ops, destroy_cq) == 31 * 8 &&
		       offsetof(struct standin_verbs_context_ops, destroy_qp) == 34 * 8 &&
		       offsetof(struct standin_verbs_context_ops, modify_qp) == 47 * 8,
	       "verbs_context_ops slot indices (x86_64)");

/* Exported by libibverbs.so.1 as @IBVERBS_PRIVATE_34 (see driver.h v44.0). */
extern void *_verbs_init_and_alloc_context(struct ibv_device *device,
					   int cmd_fd, size_t alloc_size,
					   struct verbs_context *context_offset,
					   uint32_t driver_id);
extern void verbs_set_ops(struct verbs_context *vctx,
			  const struct standin_verbs_context_ops *ops);
extern void verbs_uninit_context(struct verbs_context *context);

/* ------------------------------------------------------------------------ */
/* Output helpers                                                           */
/* ------------------------------------------------------------------------ */

static void die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("qp_history: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void emit(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static const char *qps_name(enum ibv_qp_state s)
{
	switch (s) {
	case IBV_QPS_RESET: return "RESET";
	case IBV_QPS_INIT: return "INIT";
	case IBV_QPS_RTR: return "RTR";
	case IBV_QPS_RTS: return "RTS";
	case IBV_QPS_SQD: return "SQD";
	case IBV_QPS_SQE: return "SQE";
	case IBV_QPS_ERR: return "ERR";
	default: return "UNKNOWN";
	}
}

/* ------------------------------------------------------------------------ */
/* The stand-in provider ("standin0")                                       */
/* ------------------------------------------------------------------------ */

#define STANDIN_QP_NUM 0x1a2b

/* Driver wrapper around the verbs_context, as real providers do. */
struct standin_context {
	uint32_t next_handle;
	struct verbs_context ibv_ctx;   /* deliberately not at offset 0 */
};

struct standin_pd {
	struct ibv_pd ibv_pd;
	int users;                      /* QPs on this PD */
};

struct standin_cq {
	struct ibv_cq ibv_cq;
	int users;                      /* QPs using this CQ */
};

struct standin_qp {
	struct ibv_qp ibv_qp;
	struct ibv_qp_cap cap;
	uint8_t port_num;
	uint32_t dest_qp_num;
	uint32_t rq_psn, sq_psn;
	enum ibv_mtu path_mtu;
};

static struct standin_context *to_sctx(struct ibv_context *ctx)
{
	return (struct standin_context *)((char *)ctx -
		offsetof(struct standin_context, ibv_ctx.context));
}

static uint32_t new_handle(struct ibv_context *ctx)
{
	return ++to_sctx(ctx)->next_handle;
}

static struct ibv_pd *standin_alloc_pd(struct ibv_context *context)
{
	struct standin_pd *pd = calloc(1, sizeof(*pd));

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->ibv_pd.handle = new_handle(context);
	return &pd->ibv_pd;     /* libibverbs sets pd->context */
}

static int standin_dealloc_pd(struct ibv_pd *ibpd)
{
	struct standin_pd *pd = (struct standin_pd *)ibpd;

	if (pd->users)
		return EBUSY;
	free(pd);
	return 0;
}

static struct ibv_cq *standin_create_cq(struct ibv_context *context, int cqe,
					struct ibv_comp_channel *channel,
					int comp_vector)
{
	struct standin_cq *cq;

	(void)channel;
	if (cqe < 1 || cqe > 65536 || comp_vector != 0) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->ibv_cq.handle = new_handle(context);
	cq->ibv_cq.cqe = cqe;
	/* libibverbs (verbs_init_cq) sets context, channel, cq_context,
	 * the event counters, mutex and cond. */
	return &cq->ibv_cq;
}

static int standin_destroy_cq(struct ibv_cq *ibcq)
{
	struct standin_cq *cq = (struct standin_cq *)ibcq;

	if (cq->users)
		return EBUSY;
	pthread_cond_destroy(&cq->ibv_cq.cond);
	pthread_mutex_destroy(&cq->ibv_cq.mutex);
	free(cq);
	return 0;
}

static struct ibv_qp *standin_create_qp(struct ibv_pd *pd,
					struct ibv_qp_init_attr *attr)
{
	struct standin_qp *qp;

	if (!attr->send_cq || !attr->recv_cq || attr->qp_type != IBV_QPT_RC ||
	    attr->cap.max_send_wr > 4096 || attr->cap.max_recv_wr > 4096 ||
	    attr->cap.max_send_sge > 16 || attr->cap.max_recv_sge > 16) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	/* Like a kernel-backed provider after IB_USER_VERBS_CMD_CREATE_QP. */
	qp->ibv_qp.context = pd->context;
	qp->ibv_qp.qp_context = attr->qp_context;
	qp->ibv_qp.pd = pd;
	qp->ibv_qp.send_cq = attr->send_cq;
	qp->ibv_qp.recv_cq = attr->recv_cq;
	qp->ibv_qp.srq = attr->srq;
	qp->ibv_qp.handle = new_handle(pd->context);
	qp->ibv_qp.qp_num = STANDIN_QP_NUM;
	qp->ibv_qp.state = IBV_QPS_RESET;
	qp->ibv_qp.qp_type = attr->qp_type;
	qp->ibv_qp.events_completed = 0;
	pthread_mutex_init(&qp->ibv_qp.mutex, NULL);
	pthread_cond_init(&qp->ibv_qp.cond, NULL);
	qp->cap = attr->cap;
	attr->cap.max_inline_data = 0;  /* report actual caps back */

	((struct standin_pd *)pd)->users++;
	((struct standin_cq *)attr->send_cq)->users++;
	((struct standin_cq *)attr->recv_cq)->users++;
	return &qp->ibv_qp;
}

/*
 * RC state machine and required attributes, as in the kernel's
 * ib_modify_qp_is_ok() table (subset: RESET/INIT/RTR/RTS/ERR).
 */
static int standin_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *attr,
			     int mask)
{
	struct standin_qp *qp = (struct standin_qp *)ibqp;
	enum ibv_qp_state cur = (mask & IBV_QP_CUR_STATE) ? attr->cur_qp_state
							  : ibqp->state;
	enum ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	int required = 0, ok;

	if (cur != ibqp->state)
		return EINVAL;

	switch (next) {
	case IBV_QPS_RESET:
	case IBV_QPS_ERR:
		ok = 1;
		break;
	case IBV_QPS_INIT:
		ok = cur == IBV_QPS_RESET || cur == IBV_QPS_INIT;
		if (cur == IBV_QPS_RESET)
			required = IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS;
		break;
	case IBV_QPS_RTR:
		ok = cur == IBV_QPS_INIT;
		required = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			   IBV_QP_MIN_RNR_TIMER;
		break;
	case IBV_QPS_RTS:
		ok = cur == IBV_QPS_RTR || cur == IBV_QPS_RTS;
		if (cur == IBV_QPS_RTR)
			required = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				   IBV_QP_MAX_QP_RD_ATOMIC;
		break;
	default:
		ok = 0;
		break;
	}
	if (!ok || (mask & required) != required)
		return EINVAL;
	if ((mask & IBV_QP_PORT) && attr->port_num != 1)
		return EINVAL;
	if ((mask & IBV_QP_PATH_MTU) &&
	    (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096))
		return EINVAL;

	if (mask & IBV_QP_PORT)
		qp->port_num = attr->port_num;
	if (mask & IBV_QP_DEST_QPN)
		qp->dest_qp_num = attr->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN)
		qp->rq_psn = attr->rq_psn;
	if (mask & IBV_QP_SQ_PSN)
		qp->sq_psn = attr->sq_psn;
	if (mask & IBV_QP_PATH_MTU)
		qp->path_mtu = attr->path_mtu;
	/* qp->state is written by libibverbs' ibv_modify_qp, not by us. */
	return 0;
}

static int standin_destroy_qp(struct ibv_qp *ibqp)
{
	struct standin_qp *qp = (struct standin_qp *)ibqp;

	((struct standin_pd *)ibqp->pd)->users--;
	((struct standin_cq *)ibqp->send_cq)->users--;
	((struct standin_cq *)ibqp->recv_cq)->users--;
	pthread_cond_destroy(&ibqp->cond);
	pthread_mutex_destroy(&ibqp->mutex);
	free(qp);
	return 0;
}

static const struct standin_verbs_context_ops standin_ops = {
	.alloc_pd = standin_alloc_pd,
	.dealloc_pd = standin_dealloc_pd,
	.create_cq = standin_create_cq,
	.destroy_cq = standin_destroy_cq,
	.create_qp = standin_create_qp,
	.modify_qp = standin_modify_qp,
	.destroy_qp = standin_destroy_qp,
};

static struct standin_verbs_device standin_dev;

/*
 * Runtime layout checks against the installed libibverbs:
 *  - verbs_init_context() took a reference: refcount 1 -> 2 proves our
 *    verbs_device.refcount offset matches the library's container_of().
 *  - verbs_init_context() stored sizeof(its struct verbs_context) in ->sz.
 *  - verbs_set_ops() copies each op it takes from *our* ops table into the
 *    public ibv_context_ops._compat_<op> slot (verbs_init_context() first
 *    filled them all with verbs_dummy_ops).  So after our verbs_set_ops()
 *    exactly our 7 slots must hold our functions and every other slot must
 *    be unchanged; a shifted layout would break one or the other.
 */
static void check_layouts(struct verbs_context *vctx,
			  const struct ibv_context_ops *before)
{
	const struct ibv_context_ops *o = &vctx->context.ops;
	void *const *b = (void *const *)before, *const *a = (void *const *)o;
	size_t n = sizeof(*o) / sizeof(void *), i, changed = 0;
	int rc = atomic_load(&standin_dev.refcount);

	if (rc != 2)
		die("verbs_device layout mismatch: refcount %d after init, expected 2", rc);
	if (vctx->sz != sizeof(struct verbs_context))
		die("verbs_context size mismatch: library %zu, header %zu",
		    vctx->sz, sizeof(struct verbs_context));
	if (vctx->context.device != &standin_dev.device ||
	    vctx->context.abi_compat != __VERBS_ABI_IS_EXTENDED)
		die("verbs_context not initialised by libibverbs");
#define CHECK_OP(name)                                                    \
	do {                                                              \
		if (o->_compat_##name != (void *)standin_ops.name)        \
			die("verbs_context_ops layout mismatch at " #name); \
	} while (0)
	CHECK_OP(alloc_pd);
	CHECK_OP(dealloc_pd);
	CHECK_OP(create_cq);
	CHECK_OP(destroy_cq);
	CHECK_OP(create_qp);
	CHECK_OP(modify_qp);
	CHECK_OP(destroy_qp);
#undef CHECK_OP
	for (i = 0; i < n; i++)
		if (a[i] != b[i])
			changed++;
	if (changed != 7)
		die("verbs_context_ops layout mismatch: %zu ibv_context_ops slots changed, expected 7",
		    changed);
}

/* ------------------------------------------------------------------------ */
/* The QP history                                                           */
/* ------------------------------------------------------------------------ */

static void check_resolution(void)
{
	Dl_info info;
	void *v11 = dlvsym(RTLD_DEFAULT, "ibv_create_qp", "IBVERBS_1.1");
	void *fn = (void *)&ibv_create_qp;

	if (!dladdr(fn, &info) || !info.dli_fname)
		die("dladdr(ibv_create_qp) failed");
	if (!strstr(info.dli_fname, "libibverbs.so.1"))
		die("ibv_create_qp resolved to %s, not libibverbs.so.1",
		    info.dli_fname);
	if (!v11 || v11 != fn)
		die("ibv_create_qp is not bound to ibv_create_qp@IBVERBS_1.1");
	if ((void *)&ibv_modify_qp != dlvsym(RTLD_DEFAULT, "ibv_modify_qp", "IBVERBS_1.1") ||
	    (void *)&ibv_alloc_pd != dlvsym(RTLD_DEFAULT, "ibv_alloc_pd", "IBVERBS_1.1") ||
	    (void *)&ibv_create_cq != dlvsym(RTLD_DEFAULT, "ibv_create_cq", "IBVERBS_1.1") ||
	    (void *)&ibv_destroy_qp != dlvsym(RTLD_DEFAULT, "ibv_destroy_qp", "IBVERBS_1.1") ||
	    (void *)&ibv_destroy_cq != dlvsym(RTLD_DEFAULT, "ibv_destroy_cq", "IBVERBS_1.1") ||
	    (void *)&ibv_dealloc_pd != dlvsym(RTLD_DEFAULT, "ibv_dealloc_pd", "IBVERBS_1.1"))
		die("an ibv_* entry point is not bound to its @IBVERBS_1.1 version");
	emit("{\"step\":\"resolve\",\"symbol\":\"ibv_create_qp\",\"version\":\"IBVERBS_1.1\","
	     "\"library\":\"%s\",\"offset\":%lu,\"pid\":%d}",
	     info.dli_fname,
	     (unsigned long)((char *)fn - (char *)info.dli_fbase), (int)getpid());
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
		   enum ibv_qp_state to)
{
	int ret;

	attr->qp_state = to;
	ret = ibv_modify_qp(qp, attr, mask);
	if (ret)
		die("ibv_modify_qp(%s) returned %d (%s)", qps_name(to), ret,
		    strerror(ret));
	if (qp->state != to)
		die("after ibv_modify_qp(%s) qp->state is %d, expected %d",
		    qps_name(to), (int)qp->state, (int)to);
	emit("{\"step\":\"modify_qp\",\"to\":\"%s\",\"qp_num\":%u,\"attr_mask\":%d,"
	     "\"state\":%d,\"dest_qp_num\":%u,\"ret\":%d}",
	     qps_name(to), qp->qp_num, mask, (int)qp->state,
	     ((struct standin_qp *)qp)->dest_qp_num, ret);
}

int main(int argc, char **argv)
{
	struct standin_context *sctx;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_init_attr init_attr;
	struct ibv_qp_attr attr;
	struct ibv_context_ops ops_before;
	int wait_stdin = 0, fd, ret, i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--wait-stdin"))
			wait_stdin = 1;
		else
			die("usage: %s [--wait-stdin]", argv[0]);
	}

	check_resolution();

	if (wait_stdin) {
		char line[256];

		emit("{\"step\":\"waiting\",\"pid\":%d}", (int)getpid());
		if (!fgets(line, sizeof(line), stdin) && ferror(stdin))
			die("reading stdin failed");
	}

	/* Fake device, as a provider's alloc_device would build it. */
	memset(&standin_dev, 0, sizeof(standin_dev));
	atomic_init(&standin_dev.refcount, 1);   /* our reference: never freed */
	standin_dev.device.node_type = IBV_NODE_CA;
	standin_dev.device.transport_type = IBV_TRANSPORT_IB;
	snprintf(standin_dev.device.name, sizeof(standin_dev.device.name), "standin0");
	snprintf(standin_dev.device.dev_name, sizeof(standin_dev.device.dev_name), "uverbs0");

	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		die("open /dev/null: %s", strerror(errno));

	/* Same as driver.h's verbs_init_and_alloc_context(): context_offset is
	 * offsetof(wrapper, verbs_context member) passed as a pointer. */
	sctx = _verbs_init_and_alloc_context(
		&standin_dev.device, fd, sizeof(*sctx),
		(struct verbs_context *)offsetof(struct standin_context, ibv_ctx), 0);
	if (!sctx)
		die("_verbs_init_and_alloc_context failed: %s", strerror(errno));
	ops_before = sctx->ibv_ctx.context.ops;
	verbs_set_ops(&sctx->ibv_ctx, &standin_ops);
	check_layouts(&sctx->ibv_ctx, &ops_before);
	ctx = &sctx->ibv_ctx.context;
	emit("{\"step\":\"open_device\",\"device\":\"%s\",\"ret\":0}",
	     ibv_get_device_name(ctx->device));

	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd failed: %s", strerror(errno));
	if (pd->context != ctx)
		die("ibv_alloc_pd: pd->context not set by libibverbs");
	emit("{\"step\":\"alloc_pd\",\"handle\":%u,\"ret\":0}", pd->handle);

	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!cq)
		die("ibv_create_cq failed: %s", strerror(errno));
	if (cq->context != ctx)
		die("ibv_create_cq: cq->context not set by libibverbs");
	emit("{\"step\":\"create_cq\",\"handle\":%u,\"cqe\":%d,\"ret\":0}",
	     cq->handle, cq->cqe);

	memset(&init_attr, 0, sizeof(init_attr));
	init_attr.send_cq = cq;
	init_attr.recv_cq = cq;
	init_attr.cap.max_send_wr = 16;
	init_attr.cap.max_recv_wr = 16;
	init_attr.cap.max_send_sge = 1;
	init_attr.cap.max_recv_sge = 1;
	init_attr.qp_type = IBV_QPT_RC;
	qp = ibv_create_qp(pd, &init_attr);
	if (!qp)
		die("ibv_create_qp failed: %s", strerror(errno));
	if (qp->qp_num != STANDIN_QP_NUM || qp->state != IBV_QPS_RESET ||
	    qp->qp_type != IBV_QPT_RC || qp->context != ctx)
		die("ibv_create_qp returned an unexpected QP");
	emit("{\"step\":\"create_qp\",\"qp_num\":%u,\"qp_type\":%d,\"state\":%d,"
	     "\"handle\":%u,\"ret\":0}",
	     qp->qp_num, (int)qp->qp_type, (int)qp->state, qp->handle);

	memset(&attr, 0, sizeof(attr));
	attr.pkey_index = 0;
	attr.port_num = 1;
	attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			       IBV_ACCESS_REMOTE_WRITE;
	modify(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS, IBV_QPS_INIT);

	memset(&attr, 0, sizeof(attr));
	attr.path_mtu = IBV_MTU_4096;
	attr.dest_qp_num = 0x5678b;
	attr.rq_psn = 0;
	attr.max_dest_rd_atomic = 1;
	attr.min_rnr_timer = 12;
	attr.ah_attr.dlid = 0x12;
	attr.ah_attr.sl = 0;
	attr.ah_attr.port_num = 1;
	modify(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
	       IBV_QPS_RTR);

	memset(&attr, 0, sizeof(attr));
	attr.timeout = 14;
	attr.retry_cnt = 7;
	attr.rnr_retry = 7;
	attr.sq_psn = 0;
	attr.max_rd_atomic = 1;
	modify(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			  IBV_QP_MAX_QP_RD_ATOMIC, IBV_QPS_RTS);

	memset(&attr, 0, sizeof(attr));
	modify(qp, &attr, IBV_QP_STATE, IBV_QPS_ERR);

	{
		uint32_t qpn = qp->qp_num;

		ret = ibv_destroy_qp(qp);
		if (ret)
			die("ibv_destroy_qp returned %d (%s)", ret, strerror(ret));
		emit("{\"step\":\"destroy_qp\",\"qp_num\":%u,\"ret\":%d}", qpn, ret);
	}

	ret = ibv_destroy_cq(cq);
	if (ret)
		die("ibv_destroy_cq returned %d (%s)", ret, strerror(ret));
	emit("{\"step\":\"destroy_cq\",\"ret\":%d}", ret);

	ret = ibv_dealloc_pd(pd);
	if (ret)
		die("ibv_dealloc_pd returned %d (%s)", ret, strerror(ret));
	emit("{\"step\":\"dealloc_pd\",\"ret\":%d}", ret);

	/* What a provider's free_context does: closes cmd_fd, drops the
	 * device reference (2 -> 1, so nothing is freed), frees priv. */
	verbs_uninit_context(&sctx->ibv_ctx);
	if (atomic_load(&standin_dev.refcount) != 1)
		die("device refcount %d after uninit, expected 1",
		    atomic_load(&standin_dev.refcount));
	free(sctx);

	emit("{\"step\":\"done\",\"pid\":%d}", (int)getpid());
	return 0;
}
