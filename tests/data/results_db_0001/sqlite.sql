-- cutetune's tables as first released (revision 0001: cutetune/results_db/schema.py of commit
-- 0f376bb), as SQLAlchemy creates them on sqlite, before cutetune versioned its tables.

CREATE TABLE devices (
	id INTEGER NOT NULL, 
	gpu_name VARCHAR NOT NULL, 
	compute_capability VARCHAR NOT NULL, 
	sm_count INTEGER NOT NULL, 
	driver VARCHAR NOT NULL, 
	cuda VARCHAR NOT NULL, 
	torch VARCHAR NOT NULL, 
	cutlass_dsl VARCHAR NOT NULL, 
	CONSTRAINT pk_devices PRIMARY KEY (id), 
	CONSTRAINT uq_devices_gpu_name_compute_capability_sm_count_driver_cuda_torch_cutlass_dsl UNIQUE (gpu_name, compute_capability, sm_count, driver, cuda, torch, cutlass_dsl)
);

CREATE TABLE kernels (
	id INTEGER NOT NULL, 
	name VARCHAR NOT NULL, 
	source_hash VARCHAR NOT NULL, 
	CONSTRAINT pk_kernels PRIMARY KEY (id), 
	CONSTRAINT uq_kernels_name_source_hash UNIQUE (name, source_hash)
);

CREATE TABLE problems (
	id INTEGER NOT NULL, 
	kernel_name VARCHAR NOT NULL, 
	static_key TEXT NOT NULL, 
	CONSTRAINT pk_problems PRIMARY KEY (id), 
	CONSTRAINT uq_problems_kernel_name_static_key UNIQUE (kernel_name, static_key)
);

CREATE TABLE bench_results (
	id INTEGER NOT NULL, 
	device_id INTEGER NOT NULL, 
	kernel_name VARCHAR NOT NULL, 
	static_key TEXT NOT NULL, 
	num_tokens INTEGER NOT NULL, 
	implementation VARCHAR NOT NULL, 
	median_us DOUBLE NOT NULL, 
	gbps DOUBLE NOT NULL, 
	pct_of_copy DOUBLE, 
	measured_at DATETIME NOT NULL, 
	CONSTRAINT pk_bench_results PRIMARY KEY (id), 
	CONSTRAINT fk_bench_results_device_id_devices FOREIGN KEY(device_id) REFERENCES devices (id)
);

CREATE INDEX ix_bench_results_device_id ON bench_results (device_id);

CREATE TABLE ceilings (
	id INTEGER NOT NULL, 
	device_id INTEGER NOT NULL, 
	name VARCHAR NOT NULL, 
	value DOUBLE NOT NULL, 
	measured_at DATETIME NOT NULL, 
	CONSTRAINT pk_ceilings PRIMARY KEY (id), 
	CONSTRAINT fk_ceilings_device_id_devices FOREIGN KEY(device_id) REFERENCES devices (id)
);

CREATE INDEX ix_ceilings_device_id ON ceilings (device_id);

CREATE TABLE tuning_runs (
	id INTEGER NOT NULL, 
	kernel_id INTEGER NOT NULL, 
	problem_id INTEGER NOT NULL, 
	device_id INTEGER NOT NULL, 
	bucket INTEGER NOT NULL, 
	num_tokens INTEGER NOT NULL, 
	study_name VARCHAR NOT NULL, 
	started_at DATETIME NOT NULL, 
	finished_at DATETIME NOT NULL, 
	CONSTRAINT pk_tuning_runs PRIMARY KEY (id), 
	CONSTRAINT fk_tuning_runs_kernel_id_kernels FOREIGN KEY(kernel_id) REFERENCES kernels (id), 
	CONSTRAINT fk_tuning_runs_problem_id_problems FOREIGN KEY(problem_id) REFERENCES problems (id), 
	CONSTRAINT fk_tuning_runs_device_id_devices FOREIGN KEY(device_id) REFERENCES devices (id)
);

CREATE TABLE tuning_trials (
	id INTEGER NOT NULL, 
	run_id INTEGER NOT NULL, 
	number INTEGER NOT NULL, 
	config_json TEXT NOT NULL, 
	status VARCHAR NOT NULL, 
	failure_reason TEXT, 
	median_us DOUBLE, 
	iqr_us DOUBLE, 
	repeats INTEGER, 
	gbps DOUBLE, 
	pct_roofline DOUBLE, 
	predicted_us DOUBLE, 
	CONSTRAINT pk_tuning_trials PRIMARY KEY (id), 
	CONSTRAINT uq_tuning_trials_run_id_number UNIQUE (run_id, number), 
	CONSTRAINT ck_tuning_trials_status CHECK (status IN ('ok', 'failed')), 
	CONSTRAINT fk_tuning_trials_run_id_tuning_runs FOREIGN KEY(run_id) REFERENCES tuning_runs (id)
);

CREATE INDEX ix_tuning_trials_run_id ON tuning_trials (run_id);

CREATE TABLE winners (
	id INTEGER NOT NULL, 
	kernel_id INTEGER NOT NULL, 
	problem_id INTEGER NOT NULL, 
	device_id INTEGER NOT NULL, 
	bucket INTEGER NOT NULL, 
	config_json TEXT NOT NULL, 
	median_us DOUBLE NOT NULL, 
	iqr_us DOUBLE, 
	gbps DOUBLE, 
	pct_roofline DOUBLE, 
	trial_id INTEGER NOT NULL, 
	run_id INTEGER NOT NULL, 
	updated_at DATETIME NOT NULL, 
	CONSTRAINT pk_winners PRIMARY KEY (id), 
	CONSTRAINT uq_winners_kernel_id_problem_id_device_id_bucket UNIQUE (kernel_id, problem_id, device_id, bucket), 
	CONSTRAINT fk_winners_kernel_id_kernels FOREIGN KEY(kernel_id) REFERENCES kernels (id), 
	CONSTRAINT fk_winners_problem_id_problems FOREIGN KEY(problem_id) REFERENCES problems (id), 
	CONSTRAINT fk_winners_device_id_devices FOREIGN KEY(device_id) REFERENCES devices (id), 
	CONSTRAINT fk_winners_trial_id_tuning_trials FOREIGN KEY(trial_id) REFERENCES tuning_trials (id), 
	CONSTRAINT fk_winners_run_id_tuning_runs FOREIGN KEY(run_id) REFERENCES tuning_runs (id)
);
