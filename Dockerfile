# The server image used by k8s/deployment.yaml: `docker build -t pvwire:0.1.0 .`
FROM python:3.11-slim
WORKDIR /app
COPY requirements.lock pyproject.toml README.md ./
RUN pip install --no-cache-dir -r requirements.lock
COPY server ./server
RUN pip install --no-cache-dir --no-deps .
USER 10001
EXPOSE 8080
ENTRYPOINT ["pvwire-server"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
