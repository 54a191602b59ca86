% run_toolbox.m: evaluate the MATLAB tensor-core toolbox's AMD models on make_cases.py's cases.
%
%   octave-cli --no-gui run_toolbox.m WORK TOOLBOX SHIM > /dev/null
%
% WORK: the directory make_cases.py wrote (index.txt, gNNN.in); TOOLBOX: a checkout of the
% toolbox (its models/ and models/tools/ go on the path); SHIM: this directory's shim/ plus the
% restored MI300MC.m (see README.md). For each group gNNN it writes gNNN.out: the model's D for
% each case as float64 (the model returns doubles), then n status flags (1: the model stopped
% with an error, whose message goes to stderr), computed as model(1, a, b, 1, c, format) with
% a 1 x K row, b a K x 1 column and c a scalar (one output element per call: GEMM computes every
% element independently, so this is the element of the instruction's D).
args = argv();
work = args{1};
addpath(fullfile(args{2}, 'models'));
addpath(fullfile(args{2}, 'models', 'tools'));
addpath(args{3});
fid = fopen(fullfile(work, 'index.txt'), 'r');
while true
  line = fgetl(fid);
  if ~ischar(line), break; end
  p = strsplit(strtrim(line), ' ');
  g = p{1}; model = str2func(p{2}); fmt = p{3}; n = str2double(p{4}); K = str2double(p{5});
  f = fopen(fullfile(work, [g '.in']), 'r');
  a = fread(f, [n K], 'double'); b = fread(f, [n K], 'double'); c = fread(f, [n 1], 'double');
  fclose(f);
  d = zeros(n, 1);
  err = zeros(n, 1);
  t0 = tic;
  for i = 1:n
    try
      d(i) = model(1, a(i, :), b(i, :).', 1, c(i), fmt);
    catch e
      % the model stopped with an error on this case: recorded as such (status 1) with its message
      err(i) = 1;
      fprintf(2, 'ERROR %s case %d: %s\n', g, i - 1, e.message);
    end
  end
  f = fopen(fullfile(work, [g '.out']), 'w'); fwrite(f, [d; err], 'double'); fclose(f);
  fprintf(2, '%s %s %s n=%d K=%d %.1f s\n', g, p{2}, fmt, n, K, toc(t0));
end
fclose(fid);
